"""Flags declared by the capability that reads them: :class:`Flag`, :class:`FlagGroup`, :class:`FlagValues`.

Each capability (the rendezvous, the workers, the logs, hang detection, ...) and each plugin
distribution declares its flags in one :class:`FlagGroup`, in a settings module beside the code
that uses them. The group's ``read`` turns the raw text into one typed, checked, frozen settings
object, or raises a one-line :class:`~launcher.errors.UsageError` naming the flag or the ``PET_*``
variable the value came from. :func:`build_parser` makes one argparse argument group per
:class:`FlagGroup`, so ``launcher --help`` lists the flags by capability, and :func:`read_groups`
calls every group's ``read``.

This module knows no capability: the core's groups are listed in :mod:`launcher.options`, a
plugin's come from its ``launcher_flag_groups`` hook.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile each of Flag's
# annotation strings at import, which every launch pays. Forward references are quoted.

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, NoReturn, TypeVar

from launcher.errors import UsageError
from launcher.values import one_line, quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.plugins.manager import LauncherPluginManager

__all__ = [
    "NOT_GIVEN",
    "USAGE_LINE",
    "Flag",
    "FlagGroup",
    "FlagValues",
    "build_parser",
    "read_groups",
    "switch_value",
]

S = TypeVar("S")

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


class Flag(NamedTuple):
    """One command-line flag: its spellings, its default, its ``PET_*`` fallback and its help.

    ``default`` is text, as a user would type it (``None``: unset); the group's ``read`` parses it
    like any given value. A ``switch`` takes no value and is ``False`` unless given. (A named
    tuple, like the settings objects: a dataclass costs every launch about a millisecond to
    create, and every launch declares every flag.)
    """

    #: The long spelling, ``--hang-timeout``.
    name: str
    help: str
    default: str | None = None
    #: A one-letter spelling, ``-r``.
    short: str | None = None
    #: Also accept ``--hang_timeout`` (every dashed torchrun flag has both spellings).
    underscore: bool = True
    #: On/off, no value (``--standalone``).
    switch: bool = False
    #: The environment variable that supplies the value when the flag is not given: ``True``
    #: for ``PET_<DEST>`` (torchrun's rule), a name for another (a plugin's own prefix),
    #: ``False`` for none. For a switch, an empty variable means off (Kubeflow sets
    #: ``PET_STANDALONE=""``).
    env: bool | str = True
    choices: tuple[str, ...] | None = None
    #: torchrun's own flag: a prefix of it stands for it (as in torchrun), and ``--help`` lists
    #: it before the group's other flags. Every other flag must be spelled out in full.
    torchrun: bool = False

    @property
    def dest(self) -> str:
        """The value's key: ``hang_timeout`` for ``--hang-timeout``."""
        return self.name[2:].replace("-", "_")

    @property
    def variable(self) -> str | None:
        """The environment variable that stands in for the flag (``PET_HANG_TIMEOUT``), if any."""
        if isinstance(self.env, str):
            return self.env
        return env_name(self.dest) if self.env else None

    @property
    def option_strings(self) -> list[str]:
        """Every spelling, as argparse takes them: ``-r``, ``--redirects``; ``--hang-timeout``, ``--hang_timeout``."""
        spelled = [self.short] if self.short else []
        spelled.append(self.name)
        if self.underscore and "-" in self.name[2:]:
            spelled.append("--" + self.dest)
        return spelled


#: :attr:`FlagGroup.unset` when the group gives none: its ``read`` always runs.
NOT_GIVEN: Any = type("NotGiven", (), {"__repr__": lambda self: "NOT_GIVEN"})()


class FlagGroup(Generic[S]):
    """A capability's flags and the reader that turns them into its settings object.

    ``read`` parses and checks every value of the group and returns one typed, frozen settings
    object (or raises :class:`UsageError` with one line). It may ask ``values.settings(name)`` for
    another group's settings when a check needs them (the log streams' local ranks need the
    worker count).

    A plugin can declare its flags without importing what reads them: ``read`` may be a reference,
    ``"package.module:function"``, imported the first time it is needed, and ``unset`` the settings
    object that stands for "no flag of the group used" (every value its declared default, no
    variable set). With ``unset``, a launch that uses none of the group's flags never imports
    ``read``'s module: ``--help`` and parsing need only the :class:`Flag` declarations.
    """

    __slots__ = ("_read", "description", "flags", "name", "title", "unset")

    def __init__(self, name: str, title: str, flags: Sequence[Flag], read: "Callable[[FlagValues], S] | str",
                 description: str | None = None, *, unset: Any = NOT_GIVEN) -> None:
        #: The settings object's key: ``settings["hangs"]``. Unique among all groups.
        self.name = name
        #: The heading in ``--help``.
        self.title = title
        self.flags = tuple(flags)
        if isinstance(read, str) and (":" not in read or not all(read.split(":"))):
            raise ValueError(f"flag group {name!r}: read {read!r} is not a reference like 'package.module:function'")
        self._read = read
        self.description = description
        #: The settings when no flag of the group is used (:data:`NOT_GIVEN`: always ``read``).
        self.unset = unset

    @property
    def read(self) -> "Callable[[FlagValues], S]":
        """The reader, imported now when it was given as a reference."""
        if isinstance(self._read, str):
            import importlib

            module, _, attribute = self._read.partition(":")
            target: Any = importlib.import_module(module)
            for part in attribute.split("."):
                target = getattr(target, part)
            self._read = target
        return self._read  # type: ignore[return-value]

    def used(self, values: "FlagValues") -> bool:
        """Whether any flag of the group has a value other than its declared default (given on
        the command line, or through its environment variable)."""
        for flag in self.flags:
            default = False if flag.switch else flag.default
            if values.get(flag.dest, default) != default:
                return True
        return False

    def __repr__(self) -> str:
        return f"FlagGroup({self.name!r}, flags={[flag.name for flag in self.flags]})"


def env_name(dest: str) -> str:
    """``PET_HANG_TIMEOUT`` for ``hang_timeout``."""
    return f"PET_{dest.upper()}"


def _given_on_command_line(namespace: argparse.Namespace) -> set[str]:
    given: set[str] | None = getattr(namespace, "given_flags", None)
    if given is None:
        given = set()
        namespace.given_flags = given
    return given


class FlagValues:
    """What a group's ``read`` gets: each flag's raw value, where it came from, and other groups' settings."""

    def __init__(self, args: argparse.Namespace, groups: "Sequence[FlagGroup[Any]]",
                 manager: "LauncherPluginManager | None" = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self._args = args
        self._groups = {group.name: group for group in groups}
        self._variables = {flag.dest: flag.variable for group in groups for flag in group.flags}
        self._settings: dict[str, Any] = {}
        self._reading: list[str] = []
        #: The plugin manager, for a value that names a plugin (``--nproc-per-node cuda``).
        self.manager = manager
        #: Where ``PET_*`` variables and other settings are read from.
        self.environ: Mapping[str, str] = os.environ if environ is None else environ

    def __getitem__(self, dest: str) -> Any:
        """The raw value of ``dest``: text (or ``None``) for a value flag, a bool for a switch."""
        return getattr(self._args, dest)

    def get(self, dest: str, default: Any = None) -> Any:
        """The raw value of ``dest``, or ``default`` when the parser has no such flag."""
        return getattr(self._args, dest, default)

    def given(self, dest: str) -> bool:
        """Whether ``dest`` was on the command line (not a default, not a ``PET_*`` variable)."""
        return dest in _given_on_command_line(self._args)

    def source(self, dest: str) -> str:
        """How the user gave ``dest``, for messages: ``--flag``, or ``PET_FLAG`` when it came from there."""
        variable = self._variables.get(dest, env_name(dest))
        if not self.given(dest) and variable is not None and variable in self.environ:
            return variable
        return "--" + dest.replace("_", "-")

    def settings(self, name: str) -> Any:
        """Group ``name``'s settings object, read now if it was not yet."""
        if name not in self._settings:
            if name in self._reading:
                raise RuntimeError(f"flag groups read each other in a cycle: {' -> '.join([*self._reading, name])}")
            self._reading.append(name)
            try:
                group = self._groups[name]
                if group.unset is not NOT_GIVEN and not group.used(self):
                    self._settings[name] = group.unset  # nothing to read: read's module stays unloaded
                else:
                    self._settings[name] = group.read(self)
            finally:
                self._reading.pop()
        return self._settings[name]


def read_groups(args: argparse.Namespace, groups: "Sequence[FlagGroup[Any]]",
                manager: "LauncherPluginManager | None" = None,
                environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every group's settings object, by group name, read in the groups' order."""
    values = FlagValues(args, groups, manager, environ)
    return {group.name: values.settings(group.name) for group in groups}


# -- the parser --------------------------------------------------------------------------------


class _EnvDefault(argparse.Action):
    """A value flag whose default comes from ``variable`` (``PET_<DEST>``) when that variable is set."""

    def __init__(self, dest: str, default: Any = None, required: bool = False, *, variable: str | None = None,
                 **kwargs: Any) -> None:
        env_value = os.environ.get(variable or env_name(dest))
        if env_value is not None:
            default = env_value
        super().__init__(dest=dest, default=default, required=required, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _given_on_command_line(namespace).add(self.dest)


class _Store(_EnvDefault):
    """A value flag without a ``PET_*`` fallback (torchrun reads none for it)."""

    def __init__(self, dest: str, default: Any = None, required: bool = False, *, variable: str | None = None,
                 **kwargs: Any) -> None:
        argparse.Action.__init__(self, dest=dest, default=default, required=required, **kwargs)


class _EnvSwitch(argparse.Action):
    """An on/off flag whose default comes from ``PET_<DEST>``.

    Unlike torchrun, an empty variable (as Kubeflow sets ``PET_STANDALONE=""``) means off.
    """

    def __init__(self, dest: str, default: bool = False, *, variable: str | None = None, **kwargs: Any) -> None:
        variable = variable or env_name(dest)
        env_value = os.environ.get(variable)
        if env_value is not None:
            default = switch_value(variable, env_value)
        super().__init__(dest=dest, default=default, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)
        _given_on_command_line(namespace).add(self.dest)


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


def _action(flag: Flag) -> type[argparse.Action]:
    if flag.switch:
        if not flag.env:
            raise ValueError(f"{flag.name}: a switch always has its PET_* fallback")
        return _EnvSwitch
    return _EnvDefault if flag.env else _Store


def check_groups(groups: Iterable[FlagGroup[Any]]) -> None:
    """Flags are long flags, group names and flag spellings each used once (a plugin's included).

    Raises ``ValueError`` otherwise.
    """
    names: set[str] = set()
    spellings: dict[str, str] = {}
    for group in groups:
        if group.name in names:
            raise ValueError(f"two flag groups are named {group.name!r}")
        names.add(group.name)
        for flag in group.flags:
            if not flag.name.startswith("--") or len(flag.name) < 4 or flag.name.startswith("---"):
                raise ValueError(f"flag group {group.name!r}: {flag.name!r} is not a long flag like --hang-timeout")
            for spelling in flag.option_strings:
                if spelling in spellings:
                    raise ValueError(f"{spelling} is declared by the flag groups {spellings[spelling]!r} "
                                     f"and {group.name!r}")
                spellings[spelling] = group.name


def build_parser(groups: Sequence[FlagGroup[Any]], *, description: str, version: str) -> _Parser:
    """The argument parser for ``groups``: one argparse group each, torchrun's flags first within it.

    Only torchrun's flags (:attr:`Flag.torchrun`) may be abbreviated; ``--version`` and the
    positional script and its arguments are added here.
    """
    check_groups(groups)
    parser = _Parser(prog="launcher", formatter_class=_Formatter, description=description)
    abbreviable: set[str] = set()
    for group in groups:
        section = parser.add_argument_group(group.title, group.description)
        # sorted() is stable: torchrun's flags first, each part in the group's declared order.
        for flag in sorted(group.flags, key=lambda flag: not flag.torchrun):
            kwargs: dict[str, Any] = {"action": _action(flag), "dest": flag.dest, "help": flag.help,
                                      "variable": flag.variable}
            if not flag.switch:
                kwargs["default"] = flag.default
                if flag.choices is not None:
                    kwargs["choices"] = flag.choices
            section.add_argument(*flag.option_strings, **kwargs)
            if flag.torchrun:
                abbreviable.update(s for s in flag.option_strings if s.startswith("--"))
    parser.abbreviable = frozenset(abbreviable)
    # Not torchrun's (it has none), so never abbreviated; after the script it is the script's
    # argument as any other.
    parser.add_argument("--version", action="version", version=version, help="Print launcher's version and exit.")
    parser.add_argument("training_script", help="The script (or, with --no-python, the program) each worker runs.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script.")
    return parser
