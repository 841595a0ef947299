"""floor.py after importing the modules named in its first argument: what a launcher that did no
work of its own, only those imports, would cost (``bench_floor.py --bounds``).

``python floor_imports.py MOD[,MOD...] N SCRIPT [ARGS...]``
"""

import importlib
import runpy
import sys
from pathlib import Path

for name in sys.argv[1].split(","):
    importlib.import_module(name)
sys.argv = [str(Path(__file__).with_name("floor.py")), *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
