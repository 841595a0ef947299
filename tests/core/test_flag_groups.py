"""``launcher --help`` against torchrun's own parser, and the flag-group framework's rules.

Every flag of ``torch.distributed.run.get_args_parser()`` must be in ``launcher --help`` with the
same option strings, the same default (as the text a user would type) and the same ``PET_*``
fallback; ``--help`` lists each capability's group with torchrun's flags first, in torchrun's order.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues, build_parser, read_groups
from launcher.options import core_groups

from tests.conftest import launcher_env


@pytest.fixture(scope="module")
def torchrun_actions() -> list[argparse.Action]:
    """torchrun's flags (no ``-h``, no positionals), built with no ``PET_*`` set (each changes a default).

    Imported here: the framework's own tests run on a Python without torch (the fast lane on 3.10, 3.13)."""
    torch_run = pytest.importorskip("torch.distributed.run")
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("PET_")}
    try:
        parser = torch_run.get_args_parser()
    finally:
        os.environ.update(saved)
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.fixture(scope="module")
def help_sections() -> dict[str, list[list[str]]]:
    """``launcher --help``'s sections: title -> each listed flag's option strings, in order."""
    result = subprocess.run([sys.executable, "-m", "launcher", "--help"], capture_output=True, text=True,
                            env=launcher_env({"COLUMNS": "400"}), timeout=60)
    assert result.returncode == 0, result.stderr
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in result.stdout.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line.startswith("  -"):
            invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]  # the help text follows 2+ spaces
            current.append([token.rstrip(",") for token in invocation.split() if token.startswith("-")])
    return sections


def _flags() -> Iterator[tuple[FlagGroup[Any], Flag]]:
    for group in core_groups():
        for flag in group.flags:
            yield group, flag


def _as_typed(default: object) -> str | None:
    """A default as the text a user would type: torchrun keeps some as numbers or lists."""
    if isinstance(default, list):
        return ",".join(default)
    if isinstance(default, bool) or default is None:
        return None
    return str(default)


def test_every_torchrun_flag_is_declared_with_its_spellings_default_and_variable(torchrun_actions):
    ours = {flag.name: flag for _, flag in _flags()}
    assert len(torchrun_actions) >= 30
    for action in torchrun_actions:
        long_name = next(s for s in action.option_strings if s.startswith("--"))
        flag = ours.get(long_name)
        assert flag is not None, f"torchrun's {long_name} is in no flag group"
        assert flag.option_strings == action.option_strings, long_name
        assert flag.torchrun, f"{long_name} is torchrun's: it must be marked torchrun=True (abbreviable)"
        if action.nargs == 0:  # torchrun's switches
            assert flag.switch and flag.variable == f"PET_{flag.dest.upper()}", long_name
        else:
            assert not flag.switch and _as_typed(action.default) == flag.default, long_name
            # torchrun's ``env`` action reads PET_<DEST>; a plain store action reads nothing.
            reads_pet = type(action).__name__ == "env"
            assert flag.variable == (f"PET_{flag.dest.upper()}" if reads_pet else None), long_name
        # Where torchrun has choices, the group's read checks them (one line naming them), or argparse does.
        assert action.choices is None or flag.choices in (None, tuple(action.choices)), long_name


def test_only_torchrun_flags_are_marked_torchrun(torchrun_actions):
    theirs = {s for action in torchrun_actions for s in action.option_strings}
    for _, flag in _flags():
        assert flag.torchrun == (flag.name in theirs), flag.name


def test_help_lists_every_option_string(torchrun_actions, help_sections):
    listed = {s for section in help_sections.values() for strings in section for s in strings}
    for action in torchrun_actions:
        assert set(action.option_strings) <= listed, action.option_strings
    for _, flag in _flags():
        assert set(flag.option_strings) <= listed, flag.name


def test_help_groups_list_torchrun_flags_first_in_torchrun_order(torchrun_actions, help_sections):
    order = {s: i for i, action in enumerate(torchrun_actions) for s in action.option_strings}
    groups = list(core_groups())
    assert [g.title for g in groups] == [t for t in help_sections if t not in ("positional arguments", "options")]
    for group in groups:
        listed = help_sections[group.title]
        assert listed == [flag.option_strings for flag in
                                                   sorted(group.flags, key=lambda f: not f.torchrun)]
        marks = [strings[0] in order for strings in listed]
        assert marks == sorted(marks, reverse=True), f"{group.title}: launcher's own flags before torchrun's"
        ranks = [order[strings[0]] for strings in listed if strings[0] in order]
        assert ranks == sorted(ranks), f"{group.title}: torchrun's flags out of torchrun's order"
    # The groups follow torchrun's order too, by each group's first torchrun flag.
    firsts = [min(order[s] for f in g.flags for s in f.option_strings if s in order)
              for g in groups if any(f.torchrun for f in g.flags)]
    assert firsts == sorted(firsts)


# -- the framework ------------------------------------------------------------------------------


def _group(name: str, *flags: Flag, read: Any = None) -> FlagGroup[Any]:
    return FlagGroup(name=name, title=name, flags=flags, read=read or (lambda values: None))


def _parse(groups: list[FlagGroup[Any]], argv: list[str]) -> argparse.Namespace:
    return build_parser(groups, description="test", version="test").parse_args([*argv, "train.py"])


def test_a_flag_declared_twice_is_refused():
    with pytest.raises(ValueError, match="--x-y is declared by the flag groups 'a' and 'b'"):
        _parse([_group("a", Flag("--x-y", help="")), _group("b", Flag("--x-y", help=""))], [])
    with pytest.raises(ValueError, match="two flag groups are named 'a'"):
        _parse([_group("a", Flag("--x-y", help="")), _group("a", Flag("--z-w", help=""))], [])


def test_values_sources_and_precedence(monkeypatch):
    monkeypatch.setenv("PET_SIZE_LIMIT", "7")
    monkeypatch.setenv("ACME_COLOUR", "red")
    monkeypatch.setenv("PET_FAST", "")  # empty means off
    group = _group("g", Flag("--size-limit", default="1", help=""), Flag("--colour", env="ACME_COLOUR", help=""),
                   Flag("--fast", switch=True, help=""), Flag("--plain", env=False, default="p", help=""))
    args = _parse([group], [])
    values = FlagValues(args, [group])
    assert (values["size_limit"], values["colour"], values["fast"], values["plain"]) == ("7", "red", False, "p")
    assert (values.source("size_limit"), values.source("colour"), values.source("plain")) == (
        "PET_SIZE_LIMIT", "ACME_COLOUR", "--plain")
    given = FlagValues(_parse([group], ["--size_limit", "9", "--colour=blue"]), [group])
    assert (given["size_limit"], given["colour"]) == ("9", "blue")
    assert given.given("size_limit") and not given.given("plain")
    assert (given.source("size_limit"), given.source("colour")) == ("--size-limit", "--colour")


def test_launchers_own_flags_are_never_abbreviated():
    group = _group("g", Flag("--size-limit", help=""), Flag("--tr-flag", torchrun=True, help=""))
    with pytest.raises(UsageError, match=r"did you mean --size-limit\?"):
        _parse([group], ["--size=3"])
    assert _parse([group], ["--tr-f=3"]).tr_flag == "3"


def test_groups_read_in_order_and_on_demand():
    seen: list[str] = []

    def reader(name: str, needs: str | None = None) -> Any:
        def read(values: FlagValues) -> str:
            if needs:
                values.settings(needs)
            seen.append(name)
            return name.upper()
        return read

    groups = [_group("a", read=reader("a", needs="b")), _group("b", read=reader("b")), _group("c", read=reader("c"))]
    settings = read_groups(_parse(groups, []), groups)
    assert settings == {"a": "A", "b": "B", "c": "C"} and seen == ["b", "a", "c"]  # each read once

    loop = [_group("a", read=reader("a", needs="b")), _group("b", read=reader("b", needs="a"))]
    with pytest.raises(RuntimeError, match="a -> b -> a"):
        read_groups(_parse(loop, []), loop)


def test_a_declared_group_imports_its_reader_only_when_a_flag_is_used(tmp_path, monkeypatch):
    """``read`` as a reference and ``unset``: a launch that uses none of the group's flags gets
    ``unset`` and never imports the reader's module; one flag given (or its variable set) imports
    and runs it."""
    (tmp_path / "lazy_reader_module.py").write_text(
        "def read(values):\n    return ('read', values['lazy_size'], values['lazy_on'])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("LAZY_SIZE", raising=False)
    flags = (Flag("--lazy-size", default="3", env="LAZY_SIZE", help="a size"), Flag("--lazy-on", switch=True, help=""))

    def settings(*argv: str) -> Any:
        group = FlagGroup("lazy", "lazy", flags, read="lazy_reader_module:read", unset="defaults")
        return read_groups(_parse([group], list(argv)), [group])["lazy"]

    assert settings() == "defaults" and "lazy_reader_module" not in sys.modules
    assert settings("--lazy-size", "3") == "defaults"  # the default, spelled out: nothing to read
    assert settings("--lazy-on") == ("read", "3", True) and "lazy_reader_module" in sys.modules
    monkeypatch.setenv("LAZY_SIZE", "5")
    assert settings() == ("read", "5", False)
    monkeypatch.delitem(sys.modules, "lazy_reader_module")
    with pytest.raises(ValueError, match="is not a reference"):
        FlagGroup("lazy", "lazy", flags, read="lazy_reader_module.read")


def test_the_architecture_guides_example_group_works(tmp_path, monkeypatch):
    """docs/architecture.md's "Adding a flag" example, run: help, parse, read, a bad value's line."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    section = text.split("## Adding a flag", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict[str, Any] = {"__name__": "stragglers_example"}
    exec(compile(code, "architecture.md", "exec"), namespace)
    # The example is a simpler version of the core's own stragglers group: it stands in for it.
    groups = [*(group for group in core_groups() if group.name != namespace["FLAGS"].name), namespace["FLAGS"]]
    parser = build_parser(groups, description="", version="")
    # Both spellings, with the value's name: Python 3.13's argparse names the value once, after the last.
    assert re.search(r"--straggler-factor( STRAGGLER_FACTOR)?, --straggler_factor STRAGGLER_FACTOR",
                     parser.format_help())
    script = tmp_path / "train.py"
    script.write_text("pass\n")

    def read(*argv: str) -> Any:
        return read_groups(parser.parse_args([*argv, str(script)]), groups)["stragglers"]

    assert read() == namespace["StragglerSettings"](None, 60.0)
    assert read("--nproc-per-node", "4", "--straggler_factor", "2.5") == (2.5, 60.0)
    with pytest.raises(UsageError, match=r"^--straggler-factor '3' needs two workers or more$"):
        read("--straggler-factor", "3")
    monkeypatch.setenv("PET_STRAGGLER_FACTOR", "0.5")
    parser = build_parser(groups, description="", version="")  # defaults are read when it is built
    with pytest.raises(UsageError, match=r"^PET_STRAGGLER_FACTOR must be a number above 1 and at most 100, got '0.5'$"):
        read("--nproc-per-node", "4")
