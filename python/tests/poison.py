"""NaN in the memory the CUDA caching allocator hands out next, for the GPU tests.

torch.empty often returns zeroed memory (a fresh segment), so a check that rows past the splits
are 0 would pass for an op that never writes them. `poison_next_allocations(*like)` fills blocks
the size of each tensor with NaN and frees them: the caching allocator reuses a freed block for
the next request of its size, so the op's outputs of those sizes start as NaN.
"""

from __future__ import annotations

import os

import torch


def poison_next_allocations(*like: torch.Tensor) -> None:
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        return  # no caching allocator (compute-sanitizer runs): nothing is reused
    for t in like:
        block = torch.full_like(t, float("nan"))
        del block
        probe = torch.empty_like(t)  # the block just freed, or the poison proves nothing
        if not bool(probe.isnan().all()):
            raise AssertionError(f"the caching allocator did not reuse a freed block of "
                                 f"{t.numel() * t.element_size()} bytes")  # fmt: skip
        del probe
