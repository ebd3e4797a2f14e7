"""The ``npujax`` command line."""

from npujax.cli.main import build_parser as build_parser
from npujax.cli.main import main as main

__all__ = ["main", "build_parser"]
