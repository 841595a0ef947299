"""docs/preemption.md shows the example job script as it is (the Slurm test submits the file)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_shows_the_job_script_word_for_word():
    page = (ROOT / "docs" / "preemption.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    assert (ROOT / "examples" / "preemptible_job.sh").read_text() in blocks
