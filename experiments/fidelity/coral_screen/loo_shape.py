# The screening script as run (README.md); names defined by the exec'd part of loo.py.
# ruff: noqa: F821
import sys
from pathlib import Path

sys.argv = ["x", "shape"]
# the shared part of loo.py (this folder), up to its printout
exec((Path(__file__).resolve().parent / "loo.py").read_text().split("print(len(names)")[0])
print(len(names))
for c in acts:
    run(c, show=False)
