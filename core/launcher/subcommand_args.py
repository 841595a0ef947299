"""The arguments of launcher's own subcommands (``launcher stacks``, ``status``, ``bundle``).

Each takes one target (a pid or a directory) and a few options; a problem is one
:class:`~launcher.errors.UsageError` line naming the subcommand and its usage, exit status 2.
argparse would do, but costs its import and its help machinery for three tiny grammars.
"""

from __future__ import annotations

from launcher.errors import UsageError
from launcher.values import parse_seconds, quote

__all__ = ["take_seconds", "take_switch", "take_value", "the_target"]


def take_value(args: list[str], option: str, command: str, usage: str, what: str) -> str | None:
    """Remove ``option VALUE`` from ``args``; the value, or ``None`` when the option is absent."""
    if option not in args:
        return None
    at = args.index(option)
    if at + 1 >= len(args):
        raise UsageError(f"{command}: {option} needs {what}; {usage}")
    value = args[at + 1]
    del args[at : at + 2]
    return value


def take_seconds(args: list[str], option: str, default: float, command: str, usage: str) -> float:
    """Remove ``option SECONDS`` from ``args``; the seconds (above 0), or ``default``."""
    value = take_value(args, option, command, usage, "a number of seconds")
    return default if value is None else parse_seconds(value, f"{command} {option}", zero=False)


def take_switch(args: list[str], option: str) -> bool:
    """Remove every ``option`` from ``args``; whether there was one."""
    if option not in args:
        return False
    args[:] = [arg for arg in args if arg != option]
    return True


def the_target(args: list[str], command: str, usage: str) -> str:
    """The one argument left once the options are taken; anything else is a usage error."""
    if len(args) != 1 or args[0].startswith("-"):
        extra = args[1] if len(args) > 1 and not args[0].startswith("-") else (args[0] if args else None)
        what = f"unknown argument {quote(extra)}; " if extra is not None else ""
        raise UsageError(f"{command}: {what}{usage}")
    return args[0]
