"""Every plugin kind is covered by construction.

For each kind (each class of ``launcher.plugins.types.REGISTRATION_CLASSES``): ``launcher.testing`` has a
conformance suite for it, the core runs that suite (``tests/kit``), and ``docs/plugins.md`` has a
section for its hook with a complete example (a plugin module yielding the kind's registration,
declared as an entry point of the guide's ``pyproject.toml``), which ``tests/kit/test_docs_examples.py``
installs and runs. A new hook kind fails here until all of that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launcher.plugins.hookspec import LauncherSpecs
from launcher.plugins.types import REGISTRATION_CLASSES
from launcher.testing import PluginModuleConformance, conformance_suites

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "plugins.md"
KIT = ROOT / "tests" / "kit"
CLASS_OF_KIND = {cls.kind: cls for cls in REGISTRATION_CLASSES}
KINDS = sorted(CLASS_OF_KIND)

_FENCE = re.compile(r"^```([\w+-]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_FILE_MARK = re.compile(r"^#\s*file:\s*(\S+)\s*\n")


def _sections(text: str) -> dict[str, str]:
    """Level-2 sections of a markdown page, by heading (fenced code is never a heading)."""
    sections: dict[str, str] = {}
    heading, lines, fenced = "", [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            sections[heading] = "".join(lines)
            heading, lines = line[3:].strip(), []
        else:
            lines.append(line)
    sections[heading] = "".join(lines)
    return sections


def _files(text: str) -> dict[str, str]:
    """``{path: code}`` of the fenced blocks marked ``# file: path``."""
    files = {}
    for match in _FENCE.finditer(text):
        mark = _FILE_MARK.match(match.group(2))
        if mark:
            files[mark.group(1)] = match.group(2)
    return files


def _entry_points(pyproject: str) -> dict[str, str]:
    """The ``[project.entry-points.launcher]`` table of a pyproject.toml, as ``{name: value}``."""
    table = re.search(r"^\[project\.entry-points\.launcher\]\n(.*?)(?=^\[|\Z)", pyproject, re.MULTILINE | re.DOTALL)
    assert table, "the guide's pyproject.toml declares no [project.entry-points.launcher] table"
    return dict(re.findall(r'^([\w.-]+)\s*=\s*"([^"]+)"', table.group(1), re.MULTILINE))


#: Hooks that register no named kind: a plugin's command-line flags (tested by test_flag_groups_hook_is_documented).
NOT_KINDS = {"launcher_flag_groups"}


def test_every_hook_has_a_kind() -> None:
    hooks = {name for name in vars(LauncherSpecs) if name.startswith("launcher_")}
    assert hooks - NOT_KINDS == {cls.hook for cls in REGISTRATION_CLASSES}
    assert hooks >= NOT_KINDS
    assert len(CLASS_OF_KIND) == len(REGISTRATION_CLASSES)  # one class per kind name


@pytest.mark.parametrize("kind", KINDS)
def test_kind_has_a_conformance_suite(kind: str) -> None:
    suites = conformance_suites()
    assert kind in suites, f"launcher.testing has no conformance suite for {kind!r} (SUITES_BY_KIND)"
    suite = suites[kind]
    assert issubclass(suite, PluginModuleConformance) and suite.registration_type is CLASS_OF_KIND[kind]
    assert suite.__doc__ and suite.__doc__.strip(), f"{suite.__name__} needs a docstring saying how to use it"
    own_tests = [
        name
        for name in dir(suite)
        if name.startswith("test_") and name not in vars(PluginModuleConformance) and callable(getattr(suite, name))
    ]
    assert len(own_tests) >= 3, f"{suite.__name__} checks too little of the {kind} contract: {own_tests}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_core_runs_the_suite(kind: str) -> None:
    suite = conformance_suites()[kind]
    import launcher.testing as kit

    family = {suite.__name__} | {
        name for name in kit._EXPORTS if isinstance(getattr(kit, name), type) and issubclass(getattr(kit, name), suite)
    }
    test_class = re.compile(r"^class Test\w*\((\w+)\)", re.MULTILINE)
    bases = {base for path in KIT.glob("test_*.py") for base in test_class.findall(path.read_text())}
    assert family & bases, f"no test class in tests/kit runs {suite.__name__} (or one of {sorted(family)})"


@pytest.mark.parametrize("kind", KINDS)
def test_kind_is_documented_with_a_complete_example(kind: str) -> None:
    hook = CLASS_OF_KIND[kind].hook
    text = GUIDE.read_text()
    sections = [body for heading, body in _sections(text).items() if f"`{hook}`" in heading]
    assert len(sections) == 1, f"docs/plugins.md needs one '## ... (`{hook}`)' section, found {len(sections)}"
    section = sections[0]
    examples = {
        path: code
        for path, code in _files(section).items()
        if path.endswith(".py") and re.search(rf"@hookimpl\s*\ndef {hook}\(", code)
    }
    assert examples, f"the {hook} section has no '# file:' module implementing the hook"
    [(path, code)] = examples.items()
    compile(code, path, "exec")
    registration = CLASS_OF_KIND[kind].__name__
    assert f"{registration}(" in code, f"the {hook} example yields no {registration}"
    module = path[: -len(".py")].replace("/", ".")
    pyprojects = [code for name, code in _files(text).items() if name == "pyproject.toml"]
    assert pyprojects, "docs/plugins.md has no '# file: pyproject.toml' block"
    declared = _entry_points(pyprojects[0]).values()
    assert module in declared, f"{module} is not an entry point of the guide's distribution"
    suite = conformance_suites()[kind]
    assert suite.__name__ in section, f"the {hook} section does not say how to test with {suite.__name__}"


def test_flag_groups_hook_is_documented() -> None:
    """docs/plugins.md has a section for launcher_flag_groups with an installed, complete example."""
    text = GUIDE.read_text()
    [section] = [body for heading, body in _sections(text).items() if "`launcher_flag_groups`" in heading]
    examples = {path: code for path, code in _files(section).items()
                if path.endswith(".py") and re.search(r"@hookimpl\s*\ndef launcher_flag_groups\(", code)}
    [(path, code)] = examples.items()
    compile(code, path, "exec")
    assert "FlagGroup(" in code and "Flag(" in code and "UsageError" in code
    pyprojects = [code for name, code in _files(text).items() if name == "pyproject.toml"]
    assert path[: -len(".py")].replace("/", ".") in _entry_points(pyprojects[0]).values()
