"""The command line: every torchrun flag, in both spellings, with ``PET_*`` fallbacks.

The parser only reads text; turning it into a validated :class:`~launcher.config.LaunchConfig`
is :func:`launcher.command_line.config_from_args`. Any error is a :class:`~launcher.errors.UsageError`:
one line, exit status 2, no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from launcher.errors import UsageError
from launcher.values import one_line, quote

#: What ``launcher`` with no script prints (one line, exit status 2).
USAGE_LINE = "no script given; usage: launcher [options] SCRIPT [ARGS...] ('launcher --help' lists the options)"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def switch_value(variable: str, value: str) -> bool:
    """An on/off environment variable's value: 1/true/yes/on or 0/false/no/off (empty means off).

    Anything else is a one-line :class:`UsageError` naming ``variable`` and the accepted values.
    """
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise UsageError(f"{variable}={quote(value)} is not a switch value: use 1 or 0 (empty means off)")


def check_environment(environ: Mapping[str, str]) -> bool:
    """Check the launcher's own environment switches; return whether plugins autoload.

    ``LOGLEVEL`` must name a log level and ``LAUNCHER_DISABLE_PLUGIN_AUTOLOAD`` be a switch value:
    a typo there would otherwise be read silently as the default.
    """
    from launcher.console import LOG_LEVELS

    level = environ.get("LOGLEVEL")
    if level is not None and level.strip() and level.strip().upper() not in LOG_LEVELS:
        raise UsageError(
            f"LOGLEVEL={quote(level)} is not a log level: use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    disable = environ.get("LAUNCHER_DISABLE_PLUGIN_AUTOLOAD")
    return disable is None or not switch_value("LAUNCHER_DISABLE_PLUGIN_AUTOLOAD", disable)


def _env_name(dest: str) -> str:
    return f"PET_{dest.upper()}"


def _mark_given(namespace: argparse.Namespace, dest: str) -> None:
    """Record that ``dest`` was on the command line (``--cluster`` fills only the others)."""
    _given_on_command_line(namespace).add(dest)


def _given_on_command_line(namespace: argparse.Namespace) -> set[str]:
    given: set[str] | None = getattr(namespace, "given_flags", None)
    if given is None:
        given = set()
        namespace.given_flags = given
    return given


def source_name(args: argparse.Namespace, dest: str) -> str:
    """How the user gave ``dest``, for messages: ``--flag``, or ``PET_FLAG`` when it came from there."""
    if dest not in _given_on_command_line(args) and _env_name(dest) in os.environ:
        return _env_name(dest)
    return "--" + dest.replace("_", "-")


class _EnvDefault(argparse.Action):
    """A value flag whose default comes from ``PET_<DEST>`` when that variable is set."""

    def __init__(self, dest: str, default: Any = None, required: bool = False, **kwargs: Any) -> None:
        env_value = os.environ.get(_env_name(dest))
        if env_value is not None:
            default = env_value
        super().__init__(dest=dest, default=default, required=required, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _mark_given(namespace, self.dest)


class _EnvSwitch(argparse.Action):
    """An on/off flag whose default comes from ``PET_<DEST>``.

    Unlike torchrun, an empty variable (as Kubeflow sets ``PET_STANDALONE=""``) means off.
    """

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        env_value = os.environ.get(_env_name(dest))
        if env_value is not None:
            default = switch_value(_env_name(dest), env_value)
        super().__init__(dest=dest, default=default, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)
        _mark_given(namespace, self.dest)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and raise instead of exiting.

    Long flags may be abbreviated exactly as torchrun's parser allows (argparse's ``allow_abbrev``),
    but a prefix is matched against torchrun's own flags only (:attr:`abbreviable`): a flag
    launcher adds can never make a prefix that torchrun accepts ambiguous, nor give a prefix
    torchrun refuses a meaning. launcher's own flags are spelled out in full.
    """

    #: The option strings a long-flag prefix may stand for: torchrun's, set by :func:`build_parser`.
    abbreviable: frozenset[str] = frozenset()

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        # argparse's matches for an unknown ``--prefix[=value]``; each tuple's second item is the
        # option string matched (Python 3.10 to 3.13). Short options (``-r3``) are left as they are.
        matches = super()._get_option_tuples(option_string)
        if option_string.startswith("--"):
            matches = [match for match in matches if match[1] in self.abbreviable]
        return matches

    def error(self, message: str) -> NoReturn:
        if "required: training_script" in message:
            message = USAGE_LINE
        elif message.startswith("ambiguous option: "):
            message += ": give more of the flag's name"
        elif message.startswith("unrecognized arguments: "):
            message += self._own_flag_hint(message.split(": ", 1)[1].split(" ", 1)[0])
        raise UsageError(one_line(message))

    def _own_flag_hint(self, argument: str) -> str:
        """For a prefix of launcher's own flags only: which flags it would match, and why it does not."""
        prefix = argument.split("=", 1)[0]
        if not prefix.startswith("--") or len(prefix) < 3:
            return ""
        own = []
        for action in self._actions:  # one spelling per flag: the first the prefix matches
            matched = [flag for flag in action.option_strings if flag.startswith(prefix)]
            if matched and matched[0] not in self.abbreviable:
                own.append(matched[0])
        if not own:
            return ""
        return f" (launcher's own flags are never abbreviated: did you mean {' or '.join(own)}?)"


def _terminal_columns() -> int:
    """:func:`shutil.get_terminal_size`'s columns: ``$COLUMNS``, else standard output's terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, told the width instead of asking :mod:`shutil`.

    argparse builds a formatter for every flag it adds, and the default one imports shutil (with
    bz2, lzma and fnmatch) to read the terminal's width: milliseconds of every launch's start-up.
    """

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _terminal_columns() - 2 if width is None else width)


def _flag(*names: str) -> list[str]:
    """``--foo-bar`` plus its underscore spelling ``--foo_bar``."""
    spelled: list[str] = []
    for name in names:
        spelled.append(name)
        if name.startswith("--") and "-" in name[2:]:
            spelled.append("--" + name[2:].replace("-", "_"))
    return spelled


def build_parser() -> _Parser:
    """The argument parser, identical in flags and defaults to torchrun 2.13's."""
    parser = _Parser(
        prog="launcher",
        formatter_class=_Formatter,
        description=(
            "Start a distributed PyTorch job: a drop-in replacement for torchrun. "
            "'launcher plugins [--json]' lists installed plugins."
        ),
    )
    add = parser.add_argument
    # Size of the job.
    add("--nnodes", action=_EnvDefault, default="1:1",
        help="Number of nodes, or MIN:MAX for an elastic job (default 1:1).")
    add(*_flag("--nproc-per-node"), action=_EnvDefault, default="1",
        help="Workers per node: an integer, or a device kind (cpu, cuda/gpu, xpu, auto, or an "
        "installed device provider's name).")
    # Rendezvous.
    add(*_flag("--rdzv-backend"), action=_EnvDefault, default="static", help="Rendezvous backend (default static).")
    add(*_flag("--rdzv-endpoint"), action=_EnvDefault, default="",
        help="Rendezvous endpoint, host[:port]; IPv6 as [::1]:29400.")
    add(*_flag("--rdzv-id"), action=_EnvDefault, default="none", help="Job id shared by every node.")
    add(*_flag("--rdzv-conf"), action=_EnvDefault, default="",
        help="More rendezvous settings, key1=value1,key2=value2.")
    add("--standalone", action=_EnvSwitch,
        help="Single-node job with a local rendezvous on a free port; overrides --rdzv-backend, "
        "--rdzv-endpoint and --rdzv-id.")
    # Lifecycle.
    add(*_flag("--max-restarts"), action=_EnvDefault, default="0",
        help="Restarts of the worker group before the job fails (default 0).")
    add(*_flag("--monitor-interval"), action=_EnvDefault, default="0.1",
        help="Seconds between checks for joining or lost nodes while workers run (at least 1; worker "
        "exits are noticed at once).")
    add(*_flag("--start-method"), action=_EnvDefault, default="spawn",
        help="spawn, fork or forkserver (function entrypoints only).")
    add(*_flag("--event-log-handler"), action=_EnvDefault, default="null",
        help="Event sink name, or a comma list of names (default null).")
    add("--role", action=_EnvDefault, default="default", help="Worker role name (default 'default').")
    # How the script runs.
    add("-m", "--module", action=_EnvSwitch, help="Run the script as a module, like 'python -m'.")
    add(*_flag("--no-python"), action=_EnvSwitch, help="Run the script as an executable, without python.")
    add(*_flag("--run-path"), action=_EnvSwitch, help="Run the script with runpy.run_path.")
    # Logs.
    add(*_flag("--log-dir"), action=_EnvDefault, default=None,
        help="Base directory for worker logs; a job directory is created inside it per run.")
    add("-r", "--redirects", action=_EnvDefault, default="0",
        help="Send streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank "
        "(0:1,1:2).")
    add("-t", "--tee", action=_EnvDefault, default="0",
        help="Send streams to log files and the console (same format as --redirects).")
    add(*_flag("--local-ranks-filter"), action=_EnvDefault, default="",
        help="Comma list of local ranks whose output the console shows (files keep every rank).")
    add(*_flag("--duplicate-stdout-filters"), action=_EnvDefault, default="",
        help="Comma list of strings; stdout lines containing any also go to filtered_stdout.log "
        "(',,' escapes a comma).")
    add(*_flag("--duplicate-stderr-filters"), action=_EnvDefault, default="",
        help="Comma list of strings; stderr lines containing any also go to filtered_stderr.log.")
    # Static rendezvous.
    add(*_flag("--node-rank"), action=_EnvDefault, default="0", help="This node's rank (static backend).")
    add(*_flag("--master-addr"), action=_EnvDefault, default="127.0.0.1",
        help="Address of the node with rank 0 (static backend).")
    add(*_flag("--master-port"), action=_EnvDefault, default=None,
        help="Port of the store on the rank-0 node (static backend, default 29500).")
    add(*_flag("--local-addr"), action=_EnvDefault, default=None,
        help="This node's address as the other nodes should reach it (default: its FQDN).")
    # Plugins and process control.
    add(*_flag("--logs-specs"), default=None, help="Name of a LogsSpecs plugin.")
    add(*_flag("--numa-binding"), default=None,
        help="NUMA affinity strategy: node, socket, exclusive, core-complex, or a plugin's name.")
    add(*_flag("--signals-to-handle"), action=_EnvDefault, default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        help="Signals forwarded to the workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT).")
    add(*_flag("--shutdown-timeout"), action=_EnvDefault, default=None,
        help="Seconds between a forwarded signal and SIGKILL (default TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30).")
    add(*_flag("--virtual-local-rank"), action=_EnvSwitch,
        help="Every worker sees LOCAL_RANK=0 and exactly one device.")
    # Every flag so far is torchrun's: a prefix of one of these (and of no other of these) stands
    # for it, as in torchrun; the flags below must be given in full.
    parser.abbreviable = frozenset(flag for action in parser._actions for flag in action.option_strings
                                   if flag.startswith("--"))
    # launcher's own additions (no torchrun equivalent).
    from launcher import __version__

    # Not torchrun's (it has none), so never abbreviated; after the script it is the script's
    # argument as any other.
    add("--version", action="version", version=f"launcher {__version__}",
        help="Print launcher's version and exit.")
    add(*_flag("--exit-barrier-timeout"), action=_EnvDefault, default="300",
        help="Seconds a finished node waits for the others before exiting (default 300).")
    add(*_flag("--numa-fallback"), action=_EnvDefault, default="warn", choices=("warn", "error"),
        help="When a NUMA strategy cannot apply: warn and run unbound, or fail (default warn).")
    add(*_flag("--worker-tty"), action=_EnvDefault, default="auto",
        help="Give workers pseudo-terminals (progress bars, colours): auto when the launcher's own "
        "output is a terminal, always, or never (pipes, as before; default auto).")
    add(*_flag("--hang-timeout"), action=_EnvDefault, default=None,
        help="Seconds a rank may go without a launcher.heartbeat() before it is hung: every rank's stack "
        "is printed and the group restarts like a failed one (default: off).")
    add(*_flag("--hang-watch"), action=_EnvDefault, default="heartbeat",
        help="What counts as progress for --hang-timeout: heartbeat (default), or output (any output line too).")
    add("--preload", action=_EnvDefault, default="",
        help="Comma list of modules ('torch', ...) that a template process imports once per node; every "
        "worker, at each start and restart, is forked from it instead of importing them again (default: none).")
    # -- health checks (issue 26, launcher.health) --
    add(*_flag("--health-checks"), action=_EnvDefault, default=None,
        help="Checks run before each round this node joins, comma list, or none (default: every built-in that "
        "applies: gpu, disk, python, command). A sick node stays out and exits with status 69.")
    add(*_flag("--health-check-cmd"), action=_EnvDefault, default=None,
        help="The site's health-check executable: exit 0 is healthy, else its first output line is the reason.")
    # -- end health checks --
    # -- preemption (issue 29, launcher.preemption) --
    add(*_flag("--preemption-signals"), action=_EnvDefault, default=None,
        help="Comma list of signals that mean the job is being preempted (default SIGTERM once preemption is on, "
        "which this flag or --preemption-grace turns on): every rank sees launcher.preempted(), the workers get "
        "the grace to save and exit, and the job exits with status 75.")
    add(*_flag("--preemption-grace"), action=_EnvDefault, default=None,
        help="Seconds the workers have to save and exit once preempted, before they are stopped as on any "
        "signal (default: --shutdown-timeout). Turns preemption handling on.")
    add("--requeue", action=_EnvSwitch,
        help="Under Slurm: after a preemption's save, one node runs 'scontrol requeue' for the job (when it is "
        "requeueable and Slurm is not requeueing it already). Turns preemption handling on.")
    # -- end preemption --
    add("--cluster", action=_EnvDefault, default="auto",
        help="Fill missing flags from a scheduler's environment: auto (default), none (torchrun's "
        "behaviour), or a cluster environment's name (slurm, openmpi, mpich, pmix, lsf, kubeflow).")
    add("training_script", help="The script (or, with --no-python, the program) each worker runs.")
    add("training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script.")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv`` (without the program name)."""
    return build_parser().parse_args(list(argv))
