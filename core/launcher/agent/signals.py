"""The signals the agent forwards: catching them, waking the agent, hurrying a second time.

One mechanism ends every wait of the agent (docs/failures.md, "Stopping"):

- While workers run, a signal (``--signals-to-handle``) is only recorded by its handler; the
  agent's loop sees it and forwards it to the workers. The C-level handler also writes to a
  wake-up pipe the instant the signal arrives, so an agent blocked in its selector (the workers,
  the ``--preload`` template) wakes at once.
- Everywhere else the agent waits with nothing to forward a signal to (the store connection, the
  health checks, the rendezvous, the exit barrier, serving the store until the others leave), the
  wait runs :meth:`SignalForwarder.interruptible`: the handler raises :class:`SignalReceived` in
  the main thread, which ends whatever blocking call it was in (a sleep, a socket read, a join)
  at once, and the agent says which phase it stopped in.
- Every signal is also handed to the agent's callback with whether it was the first: a second one
  tells the agent not to wait out ``--shutdown-timeout``, and once the workers are gone ends the
  agent at once (:func:`exit_now`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any

__all__ = ["SignalForwarder", "SignalReceived", "exit_now", "signal_message"]

log = logging.getLogger("launcher.agent")


class SignalReceived(Exception):
    """The agent received one of the signals it handles."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        """``SIGTERM``."""
        return signal.Signals(self.signum).name


class SignalForwarder:
    """Handlers for ``signals`` and the wake-up pipe, installed for the ``with`` block.

    Off the main thread (where Python cannot install handlers) it installs nothing: signals
    are then not forwarded, and :attr:`wakeup_fd` is ``None``.
    """

    def __init__(self, signals: Sequence[int], hurry: Callable[[int, bool], None]) -> None:
        """``hurry(signum, first)`` runs in the handler for every signal that does not raise
        :class:`SignalReceived` (``first``: no signal came before it)."""
        self._signals = tuple(signals)
        self._hurry = hurry
        #: The last signal received (``None`` until one arrives).
        self.received: int | None = None
        self._interruptible = False
        self._previous: dict[int, Any] = {}
        self._wakeup_r: int | None = None
        self._wakeup_w: int | None = None
        self._previous_wakeup_fd = -1

    @property
    def wakeup_fd(self) -> int | None:
        """Readable once a signal arrived (register it with a selector), if installed."""
        return self._wakeup_r

    def __enter__(self) -> SignalForwarder:
        if threading.current_thread() is not threading.main_thread():
            log.debug("not on the main thread: signals are not forwarded")
            return self
        # The C-level handler writes to this pipe the instant a signal arrives, waking the
        # agent's selector; the Python handler then only records which signal it was.
        self._wakeup_r, self._wakeup_w = os.pipe()
        os.set_blocking(self._wakeup_r, False)
        os.set_blocking(self._wakeup_w, False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        for signum in self._signals:
            if signal.getsignal(signum) is signal.SIG_IGN:
                # Ignored by whoever started us (nohup ignores SIGHUP, a background job SIGINT):
                # keep ignoring it rather than forward a hang-up the user asked to survive.
                log.info("%s is ignored by the parent; not forwarding it", signal.Signals(signum).name)
                continue
            with contextlib.suppress(OSError, ValueError):
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for signum, old in self._previous.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(signum, old)
        self._previous.clear()
        if self._wakeup_r is not None and self._wakeup_w is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous_wakeup_fd)
            os.close(self._wakeup_r)
            os.close(self._wakeup_w)
            self._wakeup_r = self._wakeup_w = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        first = self.received is None
        self.received = signum
        if self._interruptible:
            self._interruptible = False  # raised once: the code that catches it must not be cut short
            raise SignalReceived(signum)
        # A second Ctrl-C or SIGTERM: the user will not wait out --shutdown-timeout.
        self._hurry(signum, first)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A block that a signal ends at once with :class:`SignalReceived` (or that does not
        start, when one was already received): a wait where nothing can forward it. Nested
        blocks are one block."""
        outer = self._interruptible
        if self.received is not None:
            raise SignalReceived(self.received)
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = outer and self._interruptible


def exit_now(signum: int) -> None:
    """End this process at once with ``128 + signum``, after one line on stderr: a second
    signal once the workers are gone (nothing is left to stop gracefully; the watchdog still
    sweeps whatever the job left behind). Safe in a signal handler: no lock is taken."""
    name = signal.Signals(signum).name
    line = f"[launcher] WARNING: received {name} again: exiting at once ({128 + signum})\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode())
    os._exit(128 + signum)


def signal_message(signum: int, phase: str | None = None) -> str:
    """``received SIGTERM; workers were stopped`` (with what the signal usually means), or with
    ``phase`` (``waiting for the other nodes to join``): ``received SIGTERM while PHASE; stopped``."""
    from launcher.failures.exits import explain_signal

    name = signal.Signals(signum).name
    message = f"received {name} while {phase}; stopped" if phase else f"received {name}; workers were stopped"
    why = explain_signal(signum)
    return f"{message} ({why})" if why else message
