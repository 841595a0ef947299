"""``--preload MODULE[,MODULE...]``: workers forked from a template that imported the modules once.

Every start and restart of a torch job otherwise pays ``import torch`` in every worker. With
``--preload torch`` each node starts one *template* process (``_preload_main.py``) that imports the
named modules once, with the worker's interpreter, flags, ``sys.path`` and the environment every
worker shares. Each worker, at the first start and at every restart, is then forked from it and
becomes exactly what ``python -u SCRIPT`` (or ``-m MODULE``) would have been: its own session, its
environment, argv, working directory, CPU affinity, stdin ``/dev/null`` and stdout/stderr pipes or
ptys, with the script run as a fresh ``__main__``.

The worker stays the agent's own child. The template forks twice and the middle process exits at
once; the agent marks itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) for the moment of the
request, so the orphaned worker re-parents to the agent rather than to init. The agent therefore
reaps it with ``waitpid`` and watches it with a pidfd exactly as a worker it started itself
(:class:`~launcher.agent.process.ForkedWorker`), and no exit status has to travel through the
template (which could die and lose it). The flag is cleared right after (unless the job's
containment keeps the agent a subreaper throughout), so that what the workers orphan later goes
where it would without ``--preload``.

The template must be safe to fork: it refuses (and workers start normally, with one line saying
why) when an import initialized CUDA, started a Python thread or a native thread that a fork does
not stop (native threads are counted again after a fork that ends at once: OpenBLAS, which
``import torch`` loads through numpy, stops its pool before a fork and starts it again after, so
one worker per node needs no ``OMP_NUM_THREADS``), started a process or opened a socket. It is
re-created when a file of a module it loaded changes on disk (checked at each start and restart)
or when the workers' shared environment changes. It carries the job's token, so the watchdog kills
it with the job; the agent kills it when the job ends. The command line's agent starts it once in
the job's cgroup (see ``containment.py``), so the workers it forks are born there too; the
subreaper flag set for each fork nests with the one that containment may hold for the whole job.

Where preloading cannot apply (``--no-python``, ``--run-path`` and other function entrypoints, a
command that is not ``python -u SCRIPT``), workers start normally and one line says so.
"""

from __future__ import annotations

# Imported by the configuration's checks on every launch: what only a template needs (socket,
# subprocess, the worker classes) is imported when one is started.
import contextlib
import logging
import marshal
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from launcher.values import quote

if TYPE_CHECKING:  # pragma: no cover
    import subprocess

    from launcher.agent.process import ForkedWorker

log = logging.getLogger("launcher.agent")

TEMPLATE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_preload_main.py")
#: Where the ``--hang-timeout`` and ``--straggler-detection`` start-up hook lives
#: (``launcher.hangs.stacks.SITE_DIR``); the template needs no hook, and a forked worker loads it.
_HOOK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hangs", "_site")

#: Variables the agent sets per worker or per attempt: not part of the template's environment
#: (a module imported there would otherwise see one rank's values, and every restart would
#: re-create the template).
PER_WORKER = frozenset({
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
})
#: (--straggler-detection's file is per attempt: in the template's environment it would re-create
#: the template at every restart, and the template must hold no rank's timing state.)
PER_WORKER_PREFIXES = ("TORCHELASTIC_", "LAUNCHER_STACKS_", "LAUNCHER_HEARTBEAT_", "LAUNCHER_STRAGGLER_")

#: Largest packet the template sends.
_MAX_PACKET = 4 << 20
#: marshal's format for the messages: understood by every Python 3 since 3.4, so the workers'
#: interpreter (PYTHON_EXEC) may be another version than the agent's.
_MARSHAL_VERSION = 4


def template_env(envs: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """What every worker's environment shares, less the per-worker variables: the template's."""
    if not envs:
        return {}
    common = dict(envs[0])
    for env in envs[1:]:
        common = {key: value for key, value in common.items() if env.get(key) == value}
    for key in list(common):
        if key in PER_WORKER or key.startswith(PER_WORKER_PREFIXES):
            del common[key]
    paths = [p for p in common.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != _HOOK_DIR]
    if "PYTHONPATH" in common:
        if paths:
            common["PYTHONPATH"] = os.pathsep.join(paths)
        else:
            del common["PYTHONPATH"]
    return common


def python_form(argv: Sequence[str]) -> tuple[str, str] | None:
    """(``script`` or ``module``, sys.path[0]) for ``python -u SCRIPT ...`` / ``python -u -m MOD ...``.

    None for anything else, and for a script that the interpreter would not run as a source file
    (a zip application, a ``.pyc``), whose ``__main__`` is set up differently.
    """
    if len(argv) < 3 or argv[1] != "-u" or any("${local_rank}" in arg for arg in argv[:4]):
        return None
    if argv[2] == "-m":
        return ("module", os.getcwd()) if len(argv) > 3 else None
    script = argv[2]
    if script.startswith("-") or script.endswith(".pyc"):
        return None
    try:
        with open(script, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return None
    import zipfile

    if head == b"PK\x03\x04" or zipfile.is_zipfile(script):
        return None
    return "script", os.path.dirname(os.path.realpath(script))


class TemplateError(Exception):
    """The template could not start, or must not be forked from; the message says why."""


class Template:
    """One template process and the agent's end of its socket."""

    def __init__(self, modules: tuple[str, ...], python: Sequence[str], path0: str, env: dict[str, str],
                 display: Sequence[str], parent_death_signal: bool) -> None:
        self.modules = modules
        self.env = env
        self.path0 = path0
        self.ready = False
        import socket
        import subprocess

        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc: subprocess.Popen[bytes]
        try:
            agent = os.getpid()

            def before_exec() -> None:  # no watchdog: die with the agent, as workers then do
                from launcher.agent.process import die_with_parent

                die_with_parent(agent)

            self._proc = subprocess.Popen(
                [*python, TEMPLATE_SCRIPT, str(theirs.fileno()), path0, ",".join(modules), "--", *display],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=2,  # what the imports print goes to the launcher's own stderr, once
                start_new_session=True,  # a terminal's Ctrl-C is the agent's to handle, not the template's
                pass_fds=(theirs.fileno(),),
                preexec_fn=before_exec if parent_death_signal else None,
            )
        except BaseException:
            self._sock.close()
            raise
        finally:
            theirs.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def _receive(self) -> dict[str, Any]:
        data = self._sock.recv(_MAX_PACKET)
        if not data:
            code = self._proc.wait()
            raise TemplateError(f"the template exited ({_describe_status(code)})")
        message: dict[str, Any] = marshal.loads(data)
        return message

    def _ask(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        import socket

        data = marshal.dumps(message, _MARSHAL_VERSION)
        try:
            if fds:
                socket.send_fds(self._sock, [data], list(fds))
            else:
                self._sock.send(data)
            return self._receive()
        except (OSError, ValueError) as exc:
            raise TemplateError(f"the template stopped answering ({exc})") from None

    def wait_ready(self, wakeup_fd: int | None) -> bool:
        """Block until the imports are done; False when a signal came first (the agent will stop).

        Raises :class:`TemplateError` when the template refuses (a fork hazard) or fails.
        """
        if self.ready:
            return True
        import selectors

        with selectors.DefaultSelector() as selector:
            selector.register(self._sock, selectors.EVENT_READ)
            if wakeup_fd is not None:
                selector.register(wakeup_fd, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self._sock:
                        answer = self._receive()
                        if not answer.get("ready"):
                            raise TemplateError(str(answer.get("reason") or "the template refused"))
                        self.ready = True
                        return True
                    if _signalled(wakeup_fd):
                        return False

    def stale_file(self) -> str | None:
        """A file of a loaded module that changed on disk since the template imported it, if any."""
        answer = self._ask({"op": "check"})
        stale = answer.get("stale")
        return str(stale) if stale else None

    def spawn(self, request: dict[str, Any], stdout_fd: int, stderr_fd: int) -> int:
        """Fork a worker; its pid. Raises OSError (fork failed there) or :class:`TemplateError`."""
        answer = self._ask({"op": "spawn", **request}, (stdout_fd, stderr_fd))
        if "pid" in answer:
            return int(answer["pid"])
        errno = int(answer.get("errno") or 0)
        if errno:
            raise OSError(errno, str(answer.get("error") or os.strerror(errno)))
        raise TemplateError(str(answer.get("error") or "the template could not fork"))

    def close(self) -> None:
        """Kill the template (it holds nothing worth a graceful exit) and release its socket."""
        import subprocess

        with contextlib.suppress(OSError):
            self._sock.close()
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)


def _signalled(wakeup_fd: int | None) -> bool:
    """Drain the agent's signal wake-up pipe; whether a signal other than SIGWINCH came.

    Draining loses nothing: the agent records each signal in its handler and checks that
    record before it waits for workers.
    """
    if wakeup_fd is None:
        return False
    try:
        data = os.read(wakeup_fd, 512)
    except (BlockingIOError, OSError):
        return False
    ignorable = {int(signal.SIGWINCH), int(signal.SIGCHLD)}
    return any(byte not in ignorable for byte in data)


class Preloader:
    """The agent's handle on ``--preload``: keeps one template fresh and forks workers from it."""

    def __init__(self, modules: tuple[str, ...], command: Sequence[str], form: tuple[str, str],
                 parent_death_signal: bool) -> None:
        self.modules = modules
        self._command = list(command)
        self._mode, self._path0 = form
        self._parent_death_signal = parent_death_signal
        self._template: Template | None = None
        #: Set once preloading is off for the rest of the job (said once, in the warning).
        self._off: str | None = None

    @classmethod
    def create(cls, modules: Sequence[str], entry: Any, *, parent_death_signal: bool) -> Preloader | None:
        """A preloader for ``entry`` (a :class:`~launcher.agent.group.Entrypoint`), or None, said once,
        when preloading cannot apply to it."""
        if not modules:
            return None
        if entry.command is None:
            log.warning("--preload does not apply to function entrypoints (--run-path, the Python API's "
                        "callables): starting workers normally")
            return None
        form = python_form(entry.command)
        if form is None:
            log.warning("--preload applies to 'python -u SCRIPT' and 'python -u -m MODULE' workers, not to %s: "
                        "starting workers normally", quote(" ".join(entry.command[:3])))
            return None
        return cls(tuple(modules), entry.command, form, parent_death_signal)

    @property
    def pid(self) -> int | None:
        """The template's pid while it runs (the agent's sweeps must spare it)."""
        return self._template.pid if self._template is not None and self._template.alive else None

    def warm(self, env: Mapping[str, str]) -> None:
        """Start the template now (its imports overlap the rendezvous); the workers' env is a guess."""
        if self._off is None and self._template is None:
            try:
                self._replace(template_env([env]), None)
            except OSError as exc:
                self._give_up(f"cannot start the template ({exc})")

    def prepare(self, envs: Sequence[Mapping[str, str]], wakeup_fd: int | None = None) -> bool:
        """Make sure a fresh template is ready for workers with ``envs``; whether to fork from it."""
        if self._off is not None:
            return False
        wanted = template_env(envs)
        try:
            template = self._template
            if template is not None and not template.alive:
                self._replace(wanted, "the template exited")
            elif template is None or template.env != wanted:
                self._replace(wanted, None if template is None else "the workers' environment changed")
            elif template.ready:
                stale = template.stale_file()
                if stale is not None:
                    self._replace(wanted, f"{stale} changed on disk since the template imported it")
            assert self._template is not None
            if not self._template.wait_ready(wakeup_fd):
                self._discard()
                return False
            return True
        except TemplateError as exc:
            self._give_up(str(exc))
        except OSError as exc:
            self._give_up(f"cannot start the template ({exc})")
        return False

    def start_worker(self, local_rank: int, argv: Sequence[str], env: Mapping[str, str], stdout_fd: int,
                     stderr_fd: int, cpus: frozenset[int] | None = None,
                     parent_death_signal: bool = True) -> ForkedWorker | None:
        """Fork a worker from the template; None when it must start normally (said once).

        Raises OSError when the fork itself failed (EAGAIN: too many processes), as a normal
        start would.
        """
        template = self._template
        if self._off is not None or template is None or not template.ready:
            return None
        from launcher.agent.process import ForkedWorker, set_child_subreaper

        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": os.getcwd(),
            "cpus": sorted(cpus) if cpus else None,
            "pdeathsig": parent_death_signal,
            "agent": os.getpid(),
        }
        # While the template forks, orphans re-parent to us: the worker's middle process exits at
        # once, so the worker becomes our child. Only for this moment, so that what workers
        # orphan later goes to init as without --preload.
        set_child_subreaper(True)
        try:
            pid = template.spawn(request, stdout_fd, stderr_fd)
        except TemplateError as exc:
            self._give_up(str(exc))
            return None
        finally:
            set_child_subreaper(False)
        return ForkedWorker(local_rank, pid, time.time())

    def _replace(self, env: dict[str, str], why: str | None) -> None:
        self._discard()
        if why is not None:
            log.info("--preload: %s; re-creating the template", why)
        self._template = Template(self.modules, self._command[:2], self._path0, env,
                                  self._command[2:], self._parent_death_signal)

    def _discard(self) -> None:
        if self._template is not None:
            self._template.close()
            self._template = None

    def _give_up(self, reason: str) -> None:
        self._discard()
        if self._off is None:
            self._off = reason
            log.warning("--preload %s: not preloading: %s; starting workers normally", ",".join(self.modules), reason)

    def close(self) -> None:
        """Kill the template (the job is over)."""
        self._discard()


def start_preloader(plan: Any, watchdog: Any) -> Preloader | None:
    """The agent's preloader for ``plan`` (a :class:`~launcher.plan.LaunchPlan`), its template
    already importing; None without ``--preload`` or where it cannot apply (said once)."""
    workers = plan.workers
    preloader = Preloader.create(workers.preload, plan.entry, parent_death_signal=not watchdog.running)
    if preloader is not None:
        from launcher.containment.watchdog import job_env

        # The template is born in the job's cgroup (the command line), so what it forks is too.
        watchdog.containment.settle()
        preloader.warm(job_env({**workers.base_env, **workers.extra_env}, watchdog.token))
    return preloader


def _describe_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"
