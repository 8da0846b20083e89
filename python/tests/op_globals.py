"""The CPU tests' stand-ins for the grouped-MLP op's engine calls and caches, set wherever the op
reads them.

The op is split over modules (gmjit.torch._op: the public functions and the eager fast path;
_engine_calls: the calls into gmjit._C; _custom_ops: the torch.library ops), and the fast path
imports what it uses into _op's own globals instead of reading another module's attributes per
call. So a name can be a global of more than one module: _C and _current_stream (the fast path's
launches in _op; forward, backward and quantization in _engine_calls), _entries (the fast path
reads it, _engine_calls._admit fills it) and check_call (_op's path to the custom op,
_engine_calls._admit, the fake kernels of _custom_ops). A stand-in must reach every function that reads the name, so
`patch_op_globals` sets it in every module of gmjit.torch whose globals hold it, the same object
in each (one _entries dict), and fails where none holds it: a renamed or moved name cannot leave
a test running the real engine.
"""

from __future__ import annotations

import sys

import gmjit.torch  # loads the op's modules


def patch_op_globals(monkeypatch, **values) -> None:
    """monkeypatch.setattr(module, name, value) for each name=value, in every gmjit.torch module
    that holds the name (undone after the test, as monkeypatch does)."""
    prefix = gmjit.torch.__name__ + "."
    modules = [m for n, m in list(sys.modules.items()) if n.startswith(prefix) and m is not None]
    for name, value in values.items():
        holders = [m for m in modules if name in vars(m)]
        assert holders, f"no module of gmjit.torch holds {name!r}"
        for module in holders:
            monkeypatch.setattr(module, name, value)
