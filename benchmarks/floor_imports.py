"""floor.py after importing the modules named in its first argument: what a launcher that did no
work of its own, only those imports, would cost (``bench_floor.py --bounds``).

``python floor_imports.py MOD[,MOD...] N SCRIPT [ARGS...]``; nothing else is imported here.
"""

import os
import sys

for name in sys.argv[1].split(","):
    __import__(name)
FLOOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor.py")
sys.argv = [FLOOR, *sys.argv[2:]]
with open(FLOOR, encoding="utf-8") as source:
    exec(compile(source.read(), FLOOR, "exec"), {"__name__": "__main__"})
