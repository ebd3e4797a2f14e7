"""Benchmarks measure npujax as it is installed: with Python's bytecode caches.

``pip install`` compiles every module to bytecode (``__pycache__``), and an editable install
writes it on the first import. A shell with ``PYTHONDONTWRITEBYTECODE=1`` (this project's
development machine sets it) never writes it, so every process compiled npujax's ~150 modules
from source: 0.15-0.3 CPU s of each command, which no user pays. :func:`as_installed` removes
the variable for this process and its children and compiles each measured tree once, before
any measurement, as pip does.
"""

from __future__ import annotations

import compileall
import os
from collections.abc import Iterable
from pathlib import Path


def as_installed(trees: Iterable[str | os.PathLike[str]]) -> None:
    """Write the bytecode of each tree's ``npujax`` package and let every child process read
    and write bytecode (``PYTHONDONTWRITEBYTECODE`` removed from the environment)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    for tree in trees:
        package = Path(tree).resolve() / "npujax"
        if not compileall.compile_dir(package, quiet=1):
            raise SystemExit(f"cannot compile {package} to bytecode")
