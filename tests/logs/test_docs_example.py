"""The LogsSpecs example of docs/logs.md works as printed."""

from __future__ import annotations

import re
from pathlib import Path

from tests.logs.conftest import launch, lines

DOC = Path(__file__).resolve().parents[2] / "docs" / "logs.md"


def _example() -> str:
    blocks = re.findall(r"```python\n(# combined_logs\.py\n.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/logs.md lost its combined_logs.py example"
    return blocks[0]


def test_docs_example_plugin(tmp_path, write_script):
    site = tmp_path / "site"
    info = site / "combined_logs-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "combined_logs.py").write_text(_example())
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: combined-logs\nVersion: 1.0\n\n")
    (info / "entry_points.txt").write_text("[launcher]\ncombined = combined_logs\n")
    script = write_script("w.py", """
        import os, sys
        print(f"hello from {os.environ['RANK']}")
        print(f"warning from {os.environ['RANK']}", file=sys.stderr)
    """)
    log_dir = tmp_path / "logs"
    result = launch(["--logs-specs", "combined", "--log-dir", str(log_dir), "--standalone", "--nproc-per-node", "2",
                     script], env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr.decode()
    assert sorted((log_dir / "combined.log").read_text().splitlines()) == [
        "rank 0 stderr: warning from 0", "rank 0 stdout: hello from 0",
        "rank 1 stderr: warning from 1", "rank 1 stdout: hello from 1",
    ]
    assert lines(result.stdout) == []
    assert sorted(lines(result.stderr)) == ["[default0]:warning from 0", "[default1]:warning from 1"]
