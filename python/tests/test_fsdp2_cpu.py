"""GroupedMLP under FSDP2 (fully_shard) on 2 gloo ranks, against the same model trained in one
process, with the CPU stand-in engine of test_fp8_cpu.py on the eager path CUDA tensors take.

FSDP2 all-gathers the weights into unsharded parameters under preserved version counters, maybe
at the old address, so the module's FP8 copies must follow optimizer steps and load_state_dict
there; its MixedPrecisionPolicy casts the router weights to bf16; and sharded parameters reaching
the op get gmjit's own error.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
import traceback
import types

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)
fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("needs FSDP2 (torch.distributed.fsdp.fully_shard)", allow_module_level=True)

WORLD = 2
E, H, F = 4, 128, 128
SPLITS = [10, 6, 0, 12]
BF = torch.bfloat16


def _install_stand_in(monkeypatch) -> None:
    from op_globals import patch_op_globals
    from test_fp8_cpu import Fp8StandIn

    from gmjit.torch import _op

    s = Fp8StandIn()
    fake_c = types.SimpleNamespace(forward=s.forward, backward=s.backward,
                                   forward_fp8=s.forward_fp8, quantize_weights=s.quantize_weights)  # fmt: skip
    patch_op_globals(monkeypatch, _C=fake_c, _layer=s.layer,
                     _quant_layer=lambda E_, H_, F_, glu: types.SimpleNamespace(
                         E=E_, H=H_, F=F_, F1=2 * F_ if glu else F_),
                     _require_cuda=lambda x: 0, _weights_device=lambda w: 0,
                     _current_stream=lambda device: 0, _entries={})  # fmt: skip
    monkeypatch.setattr(_op, "_FAST_ON_CPU", True)


class _Model(torch.nn.Module):
    def __init__(self, recipe: str) -> None:
        from gmjit.torch import GroupedMLP

        super().__init__()
        self.inp = torch.nn.Linear(H, H, dtype=BF)
        self.mlps = torch.nn.ModuleList([GroupedMLP(E, H, F, recipe=recipe) for _ in range(2)])
        self.out = torch.nn.Linear(H, 8, dtype=BF)

    def forward(self, x, split, probs):
        h = self.inp(x)
        for mlp in self.mlps:
            h = h + mlp(h, split, probs)
        return self.out(h)


def _batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    T = sum(SPLITS) + 4
    return (torch.randn(T, H, generator=g).to(BF), torch.tensor(SPLITS),
            torch.rand(T, generator=g), torch.randn(T, 8, generator=g))  # fmt: skip


def _loss(y, target):
    return (y.float() - target).square().mean()


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _shard(model, mesh, **kw):
    from torch.distributed.fsdp import fully_shard

    for mlp in model.mlps:
        fully_shard(mlp, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


def _training_matches_one_process(rank, mesh, recipe, out):
    torch.manual_seed(0)
    reference = _Model(recipe)
    model = _shard(copy.deepcopy(reference), mesh, reshard_after_forward=True)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step in range(3):
        x, split, probs, target = _batch(step, rank)
        loss = _loss(model(x, split, probs), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        # One process: both ranks' batches, their losses averaged (FSDP averages the gradients).
        ref_loss = sum(_loss(reference(*_batch(step, r)[:3]), _batch(step, r)[3]) / WORLD
                       for r in range(WORLD))  # fmt: skip
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        out.append((f"{recipe} step {step} loss", loss.item() / WORLD, ref_loss.item()))
    state, ref_state = model.state_dict(), reference.state_dict()
    for name, value in state.items():
        out.append((f"{recipe} weight {name}", _full(value), ref_state[name]))


def _loads_are_seen(rank, mesh, out):
    """Inference between loads of two checkpoints in turn: the FP8 copies follow the loads,
    whose writes go to the sharded parameters, not through the unsharded ones' counters. Where
    an all-gather lands at the old address only the load hook says so (an exploratory run saw
    10 of 40 forwards stale without it); whether that happens here is the allocator's choice,
    so test_fp8_cpu.py checks the hook with the address kept on purpose."""
    from torch.distributed.fsdp import fully_shard

    from gmjit.torch import GroupedMLP

    x, split, probs, _ = _batch(0, rank)
    checkpoints, expected = [], []
    for seed in (1, 2):
        torch.manual_seed(seed)
        plain = GroupedMLP(E, H, F, recipe="fp8_block").eval()
        with torch.no_grad():
            expected.append(plain(x, split, probs))
        checkpoints.append(fully_shard(plain, mesh=mesh).state_dict())
    torch.manual_seed(1)
    model = fully_shard(GroupedMLP(E, H, F, recipe="fp8_block").eval(), mesh=mesh,
                        reshard_after_forward=False)  # fmt: skip
    with torch.no_grad():
        for i in range(20):
            for repeat in range(2):
                out.append((f"load {i} forward {repeat}", model(x, split, probs), expected[i % 2]))
            model.load_state_dict(checkpoints[(i + 1) % 2])
    # Once per load, whether or not the all-gather found the old address.
    out.append(("load quantizations", model.fp8_quantizations, 20))


def _mixed_precision_casts_the_router_weights(rank, mesh, out):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    torch.manual_seed(2)
    model = _Model("bf16").float()  # fp32 master weights, bf16 compute
    policy = MixedPrecisionPolicy(param_dtype=BF, reduce_dtype=torch.float32)
    model = _shard(model, mesh, mp_policy=policy)  # cast_forward_inputs: probs become bf16
    x, split, probs, target = _batch(0, rank)
    loss = _loss(model(x, split, probs), target)
    loss.backward()
    out.append(("mixed precision loss is finite", bool(torch.isfinite(loss).item()), True))


def _sharded_weights_outside_the_forward_are_named(rank, mesh, out):
    from gmjit.torch import grouped_mlp

    model = _shard(_Model("bf16"), mesh)
    x, split, probs, _ = _batch(0, rank)
    try:
        grouped_mlp(x, split, model.mlps[0].w1, model.mlps[0].w2)  # still sharded: DTensors
        out.append(("DTensor refused", "accepted", "refused"))
    except ValueError as e:
        out.append(("DTensor refused", "is a DTensor" in str(e), True))


def _worker(rank: int, init_file: str, result_file: str, tests_dir: str) -> None:
    import datetime
    import faulthandler

    sys.path.insert(0, tests_dir)
    from _pytest.monkeypatch import MonkeyPatch
    from torch.distributed.device_mesh import init_device_mesh

    # A rank left waiting in a collective the other never joins fails the test, not hangs it.
    faulthandler.dump_traceback_later(240, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=120))  # fmt: skip
    monkeypatch = MonkeyPatch()
    out: list = []
    cases = [("bf16 ", lambda m: _training_matches_one_process(rank, m, "bf16", out)),
             ("fp8_block ", lambda m: _training_matches_one_process(rank, m, "fp8_block", out)),
             ("load ", lambda m: _loads_are_seen(rank, m, out)),
             ("mixed precision", lambda m: _mixed_precision_casts_the_router_weights(rank, m, out)),
             ("DTensor", lambda m: _sharded_weights_outside_the_forward_are_named(rank, m, out))]  # fmt: skip
    try:
        _install_stand_in(monkeypatch)
        mesh = init_device_mesh("cpu", (WORLD,))
        for prefix, case in cases:  # each on its own: one failing leaves the others' results
            try:
                case(mesh)
                failed = 0
            except Exception:
                out.append((prefix + " ERROR", f"rank {rank}: {traceback.format_exc()}", None))
                failed = 1
            # Both ranks stop where either failed: the next case's collectives would not pair.
            flag = torch.tensor([failed])
            dist.all_reduce(flag)
            if flag.item():
                break
    except Exception:
        out.append(("ERROR", f"rank {rank}: {traceback.format_exc()}", None))
    finally:
        rows = [None] * WORLD  # rank 1's errors count too
        dist.all_gather_object(rows, [row for row in out if row[0].endswith("ERROR")])
        if rank == 0:
            torch.save(out + [row for row in rows[1] if row not in out], result_file)
        from gloo_exit import leave_group_and_exit

        leave_group_and_exit()


@pytest.fixture(scope="module")
def results():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file, result_file = os.path.join(tmp, "init"), os.path.join(tmp, "result")
        mp.spawn(_worker, args=(init_file, result_file, os.path.dirname(__file__)),
                 nprocs=WORLD, join=True)  # fmt: skip
        rows = torch.load(result_file, weights_only=False)
    errors = [row[1] for row in rows if row[0] == "ERROR"]
    assert not errors, errors[0]
    return {row[0]: row[1:] for row in rows}


def _select(results, prefix):
    chosen = {k: v for k, v in results.items() if k.startswith(prefix)}
    assert chosen, f"no results for {prefix!r}"
    error = chosen.get(prefix + " ERROR")
    assert error is None, error[0]
    return chosen


@pytest.mark.parametrize("recipe", ["bf16", "fp8_block"])
def test_fsdp2_training_matches_one_process(results, recipe):
    # The stand-in computes each expert in float64 from the same bf16 weights, so the sharded
    # run and the one-process run agree to the reduction order of the gradients.
    for name, (got, want) in _select(results, f"{recipe} ").items():
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=name)


def test_fsdp2_load_state_dict_changes_what_the_fp8_forward_reads(results):
    for name, (got, want) in _select(results, "load ").items():
        if isinstance(got, torch.Tensor):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
        else:
            assert got == want, name


def test_fsdp2_mixed_precision_policy_runs_with_bf16_router_weights(results):
    for name, (got, want) in _select(results, "mixed precision").items():
        assert got == want, name


def test_sharded_parameters_outside_fsdp2s_forward_get_gmjits_error(results):
    for name, (got, want) in _select(results, "DTensor").items():
        assert got == want, name
