"""Prints, one per line, the requirements of the installed torch that a CPU-only venv needs.

Run with the venv's python after `pip install --no-deps torch`. Dropped: the GPU compiler
(triton), the CUDA Python bindings, and the CUDA libraries a system CUDA toolkit registers with
the loader (cuBLAS, cuDNN, NCCL and the rest). Kept, with torch's own pins: the pure-Python
requirements and the CUDA libraries toolkits leave out, which libtorch_cuda still links
(cuFile, cuSPARSELt, NVSHMEM).
"""

import importlib.metadata

from pip._vendor.packaging.requirements import Requirement

DROPPED = {"triton", "cuda-bindings", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"}
TOOLKIT = "cuda-toolkit"  # one meta-package with an extra per library
TOOLKIT_EXTRAS_KEPT = {"cufile"}

for text in importlib.metadata.requires("torch") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in DROPPED:
        continue
    if req.name == TOOLKIT:
        extras = sorted(req.extras & TOOLKIT_EXTRAS_KEPT)
        if not extras:
            continue
        print(f"{req.name}[{','.join(extras)}]{req.specifier}")
        continue
    print(f"{req.name}{req.specifier}")
