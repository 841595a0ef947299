"""How a process ended, in words: signal names, why a signal kills, an exit status as text.

One place for every description of a worker's end, so the agent's log lines, the failure report
and the per-rank table say it the same way. Standard library only.
"""

from __future__ import annotations

import signal as signal_module

__all__ = ["describe_exit", "exit_status", "explain_signal", "signal_name"]

# Why a process dies of each signal, in the words a user needs to act. Only signals that kill
# by default and are seen in practice; others are named without an explanation.
_SIGNAL_EXPLANATIONS: dict[str, str] = {
    "SIGHUP": (
        "hang-up: the terminal or SSH session that started the job closed, or someone sent SIGHUP. "
        "`nohup` alone is not always enough (a launcher that forwards signals passes the hang-up "
        "on); start the job in a session of its own: `setsid nohup launcher ... > job.log 2>&1 &`, "
        "or inside tmux/screen, or through a scheduler"
    ),
    "SIGINT": "interrupted (Ctrl-C, or SIGINT sent by another process)",
    "SIGQUIT": "quit (Ctrl-\\, or SIGQUIT sent by another process)",
    "SIGILL": (
        "illegal instruction: native code built for a newer CPU than this node's, or a corrupted binary"
    ),
    "SIGABRT": (
        "aborted by native code: a failed C/C++ assertion, an uncaught C++ exception, or a library "
        "(e.g. the NCCL watchdog) deciding to stop the process; see the stderr tail"
    ),
    "SIGBUS": (
        "bus error: often shared memory (/dev/shm) ran out, e.g. data-loader workers in a container "
        "with the default 64 MB /dev/shm (raise it, e.g. `docker run --shm-size`), or a memory-mapped "
        "file was truncated"
    ),
    "SIGFPE": "arithmetic fault in native code (e.g. integer division by zero)",
    "SIGKILL": (
        "killed, which no process can catch: by the kernel's out-of-memory killer, by a scheduler "
        "enforcing a limit, or by `kill -9`"
    ),
    "SIGSEGV": (
        "segmentation fault: invalid memory access in native code (a C/C++/CUDA extension or a "
        "driver); the stderr tail shows the Python stack when faulthandler was on (it is with @record)"
    ),
    "SIGPIPE": "wrote to a pipe or socket whose reader had gone",
    "SIGTERM": (
        "asked to stop: by the launcher after another worker failed, by a scheduler (preemption, "
        "time limit), or by a user"
    ),
    "SIGXCPU": "CPU-time limit exceeded (ulimit -t)",
    "SIGXFSZ": "file-size limit exceeded (ulimit -f)",
}

# For a worker the launcher stopped because a hang was detected (the report's hang section says
# which rank hung and where every rank was), instead of SIGTERM's and SIGKILL's general words.
_AFTER_HANG_EXPLANATIONS: dict[str, str] = {
    "SIGTERM": "asked to stop by the launcher after the hang was detected (see the hang above)",
    "SIGKILL": (
        "killed by the launcher after the hang was detected: it had not stopped within --shutdown-timeout "
        "of SIGTERM (see the hang above)"
    ),
}

_OOM_EXPLANATION = (
    "killed by the kernel's out-of-memory killer (likely out of memory): the node or the job's "
    "memory cgroup ran out of memory; reduce memory use per worker (batch size, data-loader "
    "workers, pinned memory) or request more memory"
)


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, and so on; ``signal <n>`` for a number this platform does not name."""
    try:
        return signal_module.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def explain_signal(signum: int, *, likely_oom: bool = False, after_hang: bool = False) -> str | None:
    """One sentence on why a process dies of ``signum`` and what to do, or ``None`` if unknown.

    ``after_hang``: the launcher stopped the workers because it detected a hang.
    """
    name = signal_name(signum)
    if likely_oom and name == "SIGKILL":
        return _OOM_EXPLANATION
    if after_hang and name in _AFTER_HANG_EXPLANATIONS:
        return _AFTER_HANG_EXPLANATIONS[name]
    return _SIGNAL_EXPLANATIONS.get(name)


def exit_status(exitcode: int | None, signal: int | None, *, with_number: bool = False) -> str:
    """The end of a process as a noun phrase: ``signal SIGKILL``, ``exit code 1``.

    A signal wins over an exit code (a process killed by one has no exit code of its own);
    ``with_number`` adds the signal's number (``signal SIGKILL (9)``); a signal this platform does
    not name is ``signal 99``. ``unknown exit status`` when neither is known.
    """
    if signal is not None:
        name = signal_name(signal)
        if name.startswith("signal "):  # a number this platform does not name: say it once
            return name
        return f"signal {name} ({signal})" if with_number else f"signal {name}"
    if exitcode is not None:
        return f"exit code {exitcode}"
    return "unknown exit status"


def describe_exit(exitcode: int | None, signal: int | None) -> str:
    """The end of a process as a verb phrase, for log lines: ``was killed by SIGKILL``,
    ``exited with code 5``.

    ``signal`` is the number of the signal that killed it (``None`` or 0 when none did).
    """
    if signal:
        return f"was killed by {signal_name(signal)}"
    return f"exited with code {exitcode}"
