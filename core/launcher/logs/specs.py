"""LogsSpecs: where each worker's output goes.

The interface mirrors torchrun's (``torch.distributed.elastic.multiprocessing.api.LogsSpecs``)
so that a LogsSpecs written for torchrun works unchanged: it is built with ``log_dir``,
``redirects``, ``tee`` and ``local_ranks_filter``, and :meth:`LogsSpecs.reify` maps every local
rank to file paths in a :class:`LogsDest`. The agent then moves the output itself, through pipes
(:mod:`launcher.logs.pump`); a LogsSpecs only decides destinations.

Conventions of :class:`LogsDest`, as torchrun's: ``stdouts[r] == ""`` means the console;
a path means that file; :data:`os.devnull` discards. ``tee_stdouts[r]`` present means the file is
also shown on the console. Launcher extension: a :class:`~launcher.logs.sink.SinkDestination`
in place of a path sends the stream's lines to a :class:`~launcher.logs.sink.LineSink`.

Files are created with mode 0600 and directories with 0700: worker output routinely holds
tokens, paths and hostnames that other users of a shared machine should not read.
"""

from __future__ import annotations

import abc
import logging
import os
from dataclasses import dataclass, field

from launcher.logs.settings import STD_ALL, STD_ERR, STD_NONE, STD_OUT, StdSpec
from launcher.private_dirs import make_private_dir

log = logging.getLogger("launcher.logs")

#: The console, as a destination.
CONSOLE = ""


def _remove_tree(path: str) -> None:
    # shutil is imported only here: a launch has no use for it before its workers start.
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@dataclass
class LogsDest:
    """For each local rank, where its streams go (see the module docstring)."""

    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)
    tee_stdouts: dict[int, str] = field(default_factory=dict)
    tee_stderrs: dict[int, str] = field(default_factory=dict)
    error_files: dict[int, str] = field(default_factory=dict)
    filtered_stdout: str = ""
    filtered_stderr: str = ""


def std_for(spec: StdSpec, local_rank: int) -> int:
    """The Std bitmask of one local rank."""
    if isinstance(spec, dict):
        return int(spec.get(local_rank, STD_NONE))
    return int(spec)


class LogsSpecs(abc.ABC):
    """Decides where worker output goes; subclass it (or torchrun's) to change the layout."""

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: StdSpec = STD_NONE,
        tee: StdSpec = STD_NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        self._root_log_dir = log_dir
        self._redirects = redirects
        self._tee = tee
        self._local_ranks_filter = local_ranks_filter

    @abc.abstractmethod
    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Destinations for one attempt; may set ``TORCHELASTIC_ERROR_FILE`` in ``envs``."""

    @property
    @abc.abstractmethod
    def root_log_dir(self) -> str:
        """The base directory of this job's logs."""

    def finish(self, succeeded: bool) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called once when the job ends (launcher extension; torchrun's LogsSpecs lack it)."""


class DefaultLogsSpecs(LogsSpecs):
    """torchrun's layout: ``<log_dir>/<run_id>_<unique>/attempt_<n>/<local_rank>/``.

    Each rank's directory holds ``stdout.log``, ``stderr.log`` (when redirected or tee'd) and
    ``error.json``; the attempt directory holds ``filtered_stdout.log``/``filtered_stderr.log``.

    Without ``log_dir``, a private temporary directory (``$TMPDIR/launcher_*``) holds the error
    files. It is removed when the job succeeds, unless some output went *only* to files there
    (``--redirects`` without ``--tee``) or stacks were written there (:meth:`keep`): that exists
    nowhere else, so it is kept and its location logged. A failed job keeps it too (error files,
    failure report).

    ``log_dir`` equal to :data:`os.devnull` means no files at all: output goes to the console,
    as torchrun does, and workers get an empty ``TORCHELASTIC_ERROR_FILE``.
    """

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: StdSpec = STD_NONE,
        tee: StdSpec = STD_NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        if log_dir and log_dir != os.devnull and os.path.isfile(log_dir):
            raise NotADirectoryError(f"--log-dir {log_dir} is a file")
        super().__init__(log_dir, redirects, tee, local_ranks_filter)
        self._temporary = not log_dir
        self._run_log_dir: str | None = None
        self._keep = False

    @property
    def root_log_dir(self) -> str:
        if self._root_log_dir is None:
            # 0700, so nobody else can read what workers write there.
            self._root_log_dir = make_private_dir("launcher_")
        return self._root_log_dir

    @property
    def run_log_dir(self) -> str | None:
        """This job's directory, once the first attempt created it."""
        return self._run_log_dir

    def _shown(self, rank: int) -> bool:
        return not self._local_ranks_filter or rank in self._local_ranks_filter

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        nprocs = len(envs)
        first = envs.get(0, {})
        run_id = first.get("TORCHELASTIC_RUN_ID", "run")
        attempt = first.get("TORCHELASTIC_RESTART_COUNT", "0")
        dest = LogsDest()
        if self._root_log_dir == os.devnull:
            for rank in range(nprocs):
                shown = CONSOLE if self._shown(rank) else os.devnull
                dest.stdouts[rank] = dest.stderrs[rank] = shown
                envs[rank]["TORCHELASTIC_ERROR_FILE"] = ""
            return dest
        if self._run_log_dir is None:
            os.makedirs(self.root_log_dir, exist_ok=True)
            # A unique name (several agents may share log_dir) and mode 0700.
            self._run_log_dir = make_private_dir(f"{run_id}_", self.root_log_dir)
        attempt_dir = os.path.join(self._run_log_dir, f"attempt_{attempt}")
        if os.path.lexists(attempt_dir):  # not on a first start: the run's directory is new
            _remove_tree(attempt_dir)
        os.makedirs(attempt_dir, mode=0o700)
        for rank in range(nprocs):
            rank_dir = os.path.join(attempt_dir, str(rank))
            os.mkdir(rank_dir, mode=0o700)
            tee = std_for(self._tee, rank)
            redirects = std_for(self._redirects, rank)
            files = redirects | tee
            dest.stdouts[rank] = os.path.join(rank_dir, "stdout.log") if files & STD_OUT else CONSOLE
            dest.stderrs[rank] = os.path.join(rank_dir, "stderr.log") if files & STD_ERR else CONSOLE
            if tee & STD_OUT:
                dest.tee_stdouts[rank] = dest.stdouts[rank]
            if tee & STD_ERR:
                dest.tee_stderrs[rank] = dest.stderrs[rank]
            if redirects & ~tee & STD_ALL:
                self._keep = True  # this output is in the files only
            if not self._shown(rank):
                # Filtered-out ranks keep their files but never reach the console.
                dest.tee_stdouts.pop(rank, None)
                dest.tee_stderrs.pop(rank, None)
                if dest.stdouts[rank] == CONSOLE:
                    dest.stdouts[rank] = os.devnull
                if dest.stderrs[rank] == CONSOLE:
                    dest.stderrs[rank] = os.devnull
            dest.error_files[rank] = os.path.join(rank_dir, "error.json")
            envs[rank]["TORCHELASTIC_ERROR_FILE"] = dest.error_files[rank]
        dest.filtered_stdout = os.path.join(attempt_dir, "filtered_stdout.log")
        dest.filtered_stderr = os.path.join(attempt_dir, "filtered_stderr.log")
        return dest

    def keep(self) -> None:
        """Keep the temporary directory even if the job succeeds: it holds a file the user was
        pointed to (a hang's or an on-demand dump's stacks, see :mod:`launcher.hangs.monitor`)."""
        self._keep = True

    def finish(self, succeeded: bool) -> None:
        """Remove the temporary directory of a successful job (see the class docstring)."""
        if not self._temporary or not self._root_log_dir:
            return
        if succeeded and not self._keep:
            _remove_tree(self._root_log_dir)
        elif self._run_log_dir is not None:
            log.warning("worker logs kept in %s", self._run_log_dir)
