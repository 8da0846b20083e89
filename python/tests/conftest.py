"""Shared setup: a private kernel cache per test session, the `gpu` marker's skip."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

# The engine reads its cache location once, when it is created (first use): point it at a
# fresh folder so that counters mean the same on every run.
os.environ.setdefault("GMJIT_CACHE_DIR", tempfile.mkdtemp(prefix="gmjit-pytest-cache-"))
sys.path.insert(0, os.path.dirname(__file__))  # for `import reference`


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    if os.environ.get("GMJIT_GPU_REQUIRED", "0") not in ("", "0"):
        # The GPU scripts: a GPU machine whose torch sees no GPU must not pass by skipping.
        raise pytest.UsageError("GMJIT_GPU_REQUIRED is set but torch sees no CUDA GPU")
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
