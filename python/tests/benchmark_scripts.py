"""Imports a script of benchmarks/ as a module, for the tests of its CPU-side logic."""

from __future__ import annotations

import importlib
import os
import sys

BENCHMARKS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


def load(name: str):
    """benchmarks/<name>.py, imported with benchmarks/ on the path for its own imports."""
    sys.path.insert(0, BENCHMARKS)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
