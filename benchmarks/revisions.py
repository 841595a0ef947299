"""Another revision's launcher beside this checkout's, for A/B figures taken in one run.

:func:`extract` writes a revision's ``core/`` and ``plugins/`` (``git archive``) into a directory;
:func:`tree_env` runs a launcher from such a tree (or this checkout) by putting its ``core`` first
on ``PYTHONPATH``. With ``plugins``, the plugin distributions of :data:`PLUGINS` are installed as
pip would leave them: a ``.dist-info`` each (its entry point) in one shared directory
(:func:`plugin_site`), the packages from the tree that runs, so both revisions load the same
plugins, each its own code.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Distribution: (package, entry point name).
PLUGINS = {"launcher-etcd": ("launcher_etcd", "etcd"), "launcher-nodecheck": ("launcher_nodecheck", "nodecheck"),
           "launcher-webhook": ("launcher_webhook", "webhook")}


def commit_of(revision: str) -> str:
    """The commit ``revision`` names now (a branch moves: the figures say which one ran)."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", revision], check=True,
                          capture_output=True, text=True).stdout.strip()


def extract(revision: str, dest: Path) -> Path:
    """``revision``'s ``core`` and ``plugins`` under ``dest``; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "core", "plugins"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def plugin_site(dest: Path) -> Path:
    """A directory holding a ``.dist-info`` (metadata and entry point) for each of :data:`PLUGINS`."""
    for distribution, (package, name) in PLUGINS.items():
        info = dest / f"{distribution.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1.0\n\n")
        (info / "entry_points.txt").write_text(f"[launcher]\n{name} = {package}.plugin\n")
    return dest


def tree_env(env: dict[str, str], tree: Path, site: Path | None = None) -> dict[str, str]:
    """``env`` running the launcher of ``tree`` (a checkout or :func:`extract`'s directory), with
    the plugins of ``site`` (:func:`plugin_site`) from that tree when given."""
    paths = [str(tree / "core")]
    if site is not None:
        paths += [str(site), *(str(tree / "plugins" / distribution) for distribution in PLUGINS)]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}
