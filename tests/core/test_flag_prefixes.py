"""Abbreviated flags: every prefix torchrun's own parser takes, launcher takes with the same meaning.

torchrun's parser (``torch.distributed.run.get_args_parser``) lets argparse expand any unambiguous
prefix of a long flag (``--redirect=3``, ``--standalon``). launcher decides the same question
against torchrun's flags only, so its own additions never make a torchrun prefix ambiguous; its own
flags are never abbreviated. Both parsers run here in this interpreter, so both use the same argparse.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Iterator

import pytest
from launcher.errors import UsageError
from launcher.options import build_parser

torch_run = pytest.importorskip("torch.distributed.run")

SCRIPT = "train.py"


@pytest.fixture(autouse=True, scope="module")
def _parsers() -> Iterator[None]:
    """Both parsers, built once with no ``PET_*`` variable set (each would change a default)."""
    global _TORCHRUN_PARSER, _LAUNCHER_PARSER
    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("PET_")}
    try:
        _TORCHRUN_PARSER, _LAUNCHER_PARSER = torch_run.get_args_parser(), build_parser()
        yield
    finally:
        os.environ.update(saved)


_TORCHRUN_PARSER: argparse.ArgumentParser
_LAUNCHER_PARSER: argparse.ArgumentParser


def _torchrun_parse(argv: list[str]) -> argparse.Namespace | None:
    """torchrun's reading of ``argv``, or None when its parser refuses it."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return _TORCHRUN_PARSER.parse_args(argv)
        except SystemExit:
            return None


def _launcher_parse(argv: list[str]) -> argparse.Namespace | None:
    try:
        return _LAUNCHER_PARSER.parse_args(argv)
    except UsageError:
        return None


def _changed(namespace: argparse.Namespace, baseline: argparse.Namespace) -> dict[str, object]:
    """The flags ``argv`` set and their values (torchrun converts some, ``7`` to ``7.0`` or ``['7']``)."""
    return {dest: value for dest, value in vars(namespace).items()
            if dest != "given_flags" and value != getattr(baseline, dest, None)}


def _value_for(action: argparse.Action) -> str | None:
    """A value the flag accepts that differs from its default; None for a switch."""
    if action.nargs == 0:
        return None
    if action.choices:
        return next(str(choice) for choice in action.choices if choice != action.default)
    return "7"


def _torchrun_flags() -> list[tuple[str, argparse.Action]]:
    parser = torch_run.get_args_parser()
    return [(flag, action) for action in parser._actions for flag in action.option_strings
            if flag.startswith("--") and flag != "--help"]


def _cases() -> list[tuple[str, list[str], str | None]]:
    """(id, argv, value) for every prefix of every torchrun long flag, both ``--p=v`` and ``--p v`` forms."""
    cases = []
    for flag, action in _torchrun_flags():
        value = _value_for(action)
        for end in range(3, len(flag) + 1):
            prefix = flag[:end]
            if value is None:
                cases.append((prefix, [prefix, SCRIPT], None))
            else:
                cases.append((f"{prefix}={value}", [f"{prefix}={value}", SCRIPT], value))
                cases.append((f"{prefix} {value}", [prefix, value, SCRIPT], value))
    return cases


CASES = _cases()


def test_launcher_has_every_torchrun_flag() -> None:
    ours = set(build_parser()._option_string_actions)
    theirs = set(torch_run.get_args_parser()._option_string_actions)
    assert theirs <= ours, sorted(theirs - ours)


def test_every_prefix_reads_as_torchrun_reads_it() -> None:
    """Each prefix: both parsers refuse it, or both set the same flag to the same value."""
    torch_baseline = _torchrun_parse([SCRIPT])
    our_baseline = _launcher_parse([SCRIPT])
    assert torch_baseline is not None and our_baseline is not None
    accepted = refused = 0
    differences = []
    for case_id, argv, value in CASES:
        theirs = _torchrun_parse(argv)
        ours = _launcher_parse(argv)
        if theirs is None:
            refused += 1
            if ours is not None:
                differences.append(f"{case_id}: torchrun refuses it, launcher reads {_changed(ours, our_baseline)}")
            continue
        accepted += 1
        their_flags = _changed(theirs, torch_baseline)
        if ours is None:
            differences.append(f"{case_id}: torchrun reads {their_flags}, launcher refuses it")
            continue
        # The same flag, holding the text given (launcher reads values as text and checks them later).
        expected = {dest: True if value is None else value for dest in their_flags}
        if _changed(ours, our_baseline) != expected:
            differences.append(f"{case_id}: torchrun reads {their_flags}, launcher {_changed(ours, our_baseline)}")
    assert not differences, "\n".join(differences)
    # Abbreviations exist at all, and so do ambiguous prefixes (--nproc: both spellings match).
    assert accepted > 300 and refused > 20, (accepted, refused)


@pytest.mark.parametrize(("argv", "dest", "value"), [
    (["--redirect=3"], "redirects", "3"),
    (["--redirect", "3"], "redirects", "3"),
    (["--standalon"], "standalone", True),
    (["--max-restart=0"], "max_restarts", "0"),
    (["--nproc-per=2"], "nproc_per_node", "2"),
    (["--nproc_per=2"], "nproc_per_node", "2"),
    (["--run-p"], "run_path", True),
    (["--numa-b", "node"], "numa_binding", "node"),
    (["-r3"], "redirects", "3"),
])
def test_known_torchrun_abbreviations(argv: list[str], dest: str, value: object) -> None:
    args = build_parser().parse_args([*argv, SCRIPT, "--redirect=9"])
    assert getattr(args, dest) == value
    assert args.training_script_args == ["--redirect=9"]  # the script's own arguments are not touched


@pytest.mark.parametrize(("argv", "names"), [
    (["--exit-barrier=5"], "--exit-barrier-timeout"),
    (["--exit_barrier=5"], "--exit_barrier_timeout"),
    (["--hang", "5"], "--hang-timeout or --hang-watch or --hang-factor or --hang-start-timeout or --hang-floor"),
    (["--prel=torch"], "--preload"),
    (["--worker-t", "never"], "--worker-tty"),
    (["--clus=none"], "--cluster"),
    (["--vers"], "--version"),
])
def test_launchers_own_flags_are_never_abbreviated(argv: list[str], names: str) -> None:
    with pytest.raises(UsageError) as caught:
        build_parser().parse_args([*argv, SCRIPT])
    assert f"did you mean {names}?" in str(caught.value)


@pytest.mark.parametrize("prefix", ["--numa", "--nproc", "--r", "--max"])
def test_a_prefix_torchrun_finds_ambiguous_is_refused_in_one_line(prefix: str) -> None:
    assert _torchrun_parse([f"{prefix}=1", SCRIPT]) is None
    with pytest.raises(UsageError) as caught:
        build_parser().parse_args([f"{prefix}=1", SCRIPT])
    assert str(caught.value).startswith(f"ambiguous option: {prefix}=1 could match")
    assert "give more of the flag's name" in str(caught.value)


def test_launchers_own_flags_leave_torchrun_prefixes_alone() -> None:
    """``--numa-`` is a prefix of torchrun's ``--numa-binding`` and of launcher's ``--numa-fallback``:
    it still means what it means to torchrun, not an ambiguity."""
    theirs = _torchrun_parse(["--numa-=node", SCRIPT])
    assert theirs is not None and theirs.numa_binding == "node"
    ours = _launcher_parse(["--numa-=node", SCRIPT])
    assert ours is not None and ours.numa_binding == "node" and ours.numa_fallback == "warn"
