"""gmjit: JIT-compiled fused grouped-MLP (mixture-of-experts) layers.

`import gmjit` needs no GPU and no torch. The torch op and module live in `gmjit.torch`, the
transformers experts implementation in `gmjit.transformers`.
"""

from __future__ import annotations

from gmjit import _C
from gmjit._C import Error

Error.__doc__ = ("An engine error other than a bad argument (those are ValueErrors): a failed "
                 "compile (with NVRTC's log), a CUDA driver error, an unsupported device.")

__version__ = "0.3.0"
__all__ = ["Error", "cache_directory", "counters", "devices", "driver_available", "nvrtc_version",
           "supported_arches"]


def counters() -> dict[str, int | float]:
    """The process-wide engine's counters.

    Keys: plans_built (forward_plans_built + backward_plans_built), kernels_compiled,
    nvrtc_seconds, disk_reads (disk_shared_reads of them from shared layers), disk_writes,
    memory_hits (plan lookups served from memory),
    workspace_bytes (device memory the engine holds for scratch).
    """
    return _C.counters()


def driver_available() -> bool:
    """Whether a CUDA driver could be loaded (False on machines without one)."""
    return _C.driver_available()[0]


def devices() -> list[dict]:
    """The CUDA devices: ordinal, name, arch (e.g. "sm_90a"), multiprocessors, memory_bytes."""
    return _C.devices()


def cache_directory() -> str:
    """Where compiled kernels are kept across processes (see GMJIT_CACHE_DIR)."""
    return _C.cache_directory()


def nvrtc_version() -> str:
    """The linked NVRTC's "major.minor" (what compiles the kernels; part of every cache key)."""
    return _C.nvrtc_version()


def supported_arches() -> list[str]:
    """The arches gmjit generates kernels for ("sm_80", "sm_90a", ...), e.g. for
    gmjit.torch.prepare's `arch`."""
    return _C.supported_arches()
