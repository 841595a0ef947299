"""``python agent_modules.py LAUNCHER-ARGS``: the launcher, then a note of whether it loaded torch.

Writes ``torch loaded: True|False`` to the file ``MN_MODULES_FILE`` names when the agent exits.
"""

from __future__ import annotations

import os
import sys

from launcher.cli import main

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    finally:
        with open(os.environ["MN_MODULES_FILE"], "w") as handle:
            handle.write(f"torch loaded: {'torch' in sys.modules}\n")
