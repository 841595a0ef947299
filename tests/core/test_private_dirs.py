"""launcher.private_dirs: the log directory's maker, without tempfile."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from launcher import private_dirs
from launcher.private_dirs import make_private_dir, temp_root


def test_a_new_directory_only_its_owner_can_use(tmp_path: Path) -> None:
    made = make_private_dir("launcher_", str(tmp_path))
    assert os.path.isabs(made) and os.path.dirname(made) == str(tmp_path)
    assert os.path.basename(made).startswith("launcher_")
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert not os.listdir(made)


def test_every_call_makes_another_directory(tmp_path: Path) -> None:
    made = {make_private_dir("run_", str(tmp_path)) for _ in range(50)}
    assert len(made) == 50
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(path) for path in made)


def test_a_relative_parent_gives_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("logs")
    made = make_private_dir("x_", "logs")
    assert made.startswith(str(tmp_path / "logs") + os.sep)


def test_an_existing_entry_is_never_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first two names drawn are taken (a directory, and a link someone planted): the third is used.
    draws = iter([b"\x00" * 6, b"\x01" * 6, b"\x02" * 6])
    monkeypatch.setattr(private_dirs.os, "urandom", lambda n: next(draws))
    (tmp_path / ("p_" + "00" * 6)).mkdir()
    (tmp_path / ("p_" + "01" * 6)).symlink_to(tmp_path / "elsewhere")
    made = make_private_dir("p_", str(tmp_path))
    assert made == str(tmp_path / ("p_" + "02" * 6))
    assert not (tmp_path / "elsewhere").exists()


def test_it_gives_up_when_no_name_is_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(private_dirs.os, "urandom", lambda n: b"\x07" * n)
    (tmp_path / ("p_" + "07" * 6)).mkdir()
    with pytest.raises(FileExistsError, match="no unused name"):
        make_private_dir("p_", str(tmp_path))


def test_the_default_place_is_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert temp_root() == str(tmp_path)
    assert os.path.dirname(make_private_dir("launcher_")) == str(tmp_path)


def test_an_unusable_tmpdir_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usable = tmp_path / "usable"
    usable.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    monkeypatch.setenv("TEMP", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TMP", str(usable))
    assert temp_root() == str(usable)


def test_the_same_place_tempfile_would_choose(tmp_path: Path) -> None:
    # Compared in fresh interpreters: tempfile caches its choice for the life of a process.
    for env in ({"TMPDIR": str(tmp_path)}, {"TMPDIR": "", "TEMP": str(tmp_path)}, {"TMPDIR": "/nonexistent"}):
        full = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")} | env
        ours, theirs = (subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                                       check=True).stdout for code in (
            "from launcher.private_dirs import temp_root; print(temp_root())",
            "import tempfile; print(tempfile.gettempdir())"))
        assert ours == theirs, env
