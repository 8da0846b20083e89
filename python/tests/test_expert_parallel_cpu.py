"""ExpertParallelMoE over gloo on the CPU: 2 processes, torch experts injected in place of gmjit,
forward and all gradients against the single-process fp32 reference (distributed/ep_common.py)."""

from __future__ import annotations

import os
import sys
import tempfile
import traceback

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "distributed"))
import ep_common  # noqa: E402

WORLD = 2


def _worker(rank: int, world: int, init_file: str, result_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        rows = []
        for case in ep_common.CASES:
            rows += ep_common.run_case(case, torch.device("cpu"), "torch")
        if rank == 0:
            with open(result_file, "w") as f:
                for name, q, err, ok in rows:
                    f.write(f"{name}\t{q}\t{err}\t{int(ok)}\n")
    except Exception:
        if rank == 0:
            with open(result_file, "w") as f:
                f.write("ERROR\t" + traceback.format_exc().replace("\n", " | ") + "\t0\t0\n")
        raise
    finally:
        _leave_group()


def _leave_group() -> None:
    """The end of every rank's worker: gloo_exit.leave_group_and_exit (why: there)."""
    from gloo_exit import leave_group_and_exit

    leave_group_and_exit()


def _spawn(worker) -> str:
    """Runs worker(rank, WORLD, init_file, result_file) on WORLD gloo ranks; rank 0's result."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        result_file = os.path.join(tmp, "result")
        mp.spawn(worker, args=(WORLD, init_file, result_file), nprocs=WORLD, join=True)
        with open(result_file) as f:
            return f.read()


def test_expert_parallel_gloo_matches_reference():
    rows = [line.split("\t") for line in _spawn(_worker).splitlines()]
    assert rows, "rank 0 wrote no results"
    bad = [r for r in rows if r[3] != "1"]
    assert not bad, "\n".join(" ".join(r) for r in bad)
    cases = {r[0] for r in rows}
    assert cases == {c[0] for c in ep_common.CASES}


def _scale_worker(rank: int, world: int, init_file: str, result_file: str) -> None:
    """seed=None with per-rank generators: one router; average=True: every gradient / W."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(100 + rank)  # ranks seeded differently, as for dropout
        layer = ep_common.ExpertParallelMoE(64, 64, 4, 2, experts="torch")
        routers = [torch.empty_like(layer.router.weight) for _ in range(world)]
        dist.all_gather(routers, layer.router.weight.detach().contiguous())
        same = all(torch.equal(r, routers[0]) for r in routers)
        x = torch.randn(16, 64).to(torch.bfloat16)
        layer(x).float().square().sum().backward()
        summed = [p.grad.clone() for p in (layer.w1, layer.w2)]
        router_local = layer.router.weight.grad.clone()
        layer.allreduce_router_grad(average=True)
        router_sum = router_local.clone()
        dist.all_reduce(router_sum)
        ok = same and all(torch.allclose(p.grad, g / world) for p, g in
                          zip((layer.w1, layer.w2), summed)) and torch.allclose(
                              layer.router.weight.grad, router_sum / world)  # fmt: skip
        if rank == 0:
            with open(result_file, "w") as f:
                f.write(f"{int(same)} {int(ok)}\n")
    finally:
        _leave_group()


def test_replicated_router_is_shared_and_average_puts_every_gradient_on_one_scale():
    same, ok = _spawn(_scale_worker).split()
    assert same == "1", "seed=None gave the ranks different routers"
    assert ok == "1", "average=True left the experts' and the router's gradients on two scales"


def test_the_router_runs_in_fp32_under_autocast():
    # Autocast would run the linear in bf16 and move tokens between experts.
    torch.manual_seed(0)
    layer = ep_common.ExpertParallelMoE(256, 64, 64, 8, distributed=False, experts="torch",
                                        seed=1)  # fmt: skip
    x = torch.randn(512, 256)
    weights, experts = layer.route(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        weights_ac, experts_ac = layer.route(x)
        y = layer(x)
    assert weights_ac.dtype == torch.float32
    assert torch.equal(experts, experts_ac) and torch.equal(weights, weights_ac)
    assert y.shape == x.shape


def test_misuse_is_refused_before_any_collective(monkeypatch):
    layer = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch", seed=1)
    with pytest.raises(ValueError, match=r"hidden=64\], got shape \[64, 20\]"):
        layer(torch.randn(64, 20).to(torch.bfloat16))  # transposed [H, T]
    with pytest.raises(ValueError, match="distributed=False"):
        ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, group=object())
    # torchrun's environment, but no process group yet: not a silent single-process layer.
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="init_process_group"):
        ep_common.ExpertParallelMoE(64, 64, 4, 2, experts="torch")
    ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch")


def test_single_process_layer_matches_reference():
    """distributed=False (no collectives), torch experts, against the reference."""
    torch.manual_seed(0)
    layer = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch", seed=3)
    x = torch.randn(20, 64).to(torch.bfloat16).requires_grad_()
    y = layer(x)
    dy = torch.randn(20, 64)
    (y.float() * dy).sum().backward()
    xr = x.detach().float().requires_grad_()
    ws = [p.detach().float().requires_grad_() for p in (layer.router.weight, layer.w1, layer.w2)]
    yr = ep_common.reference_moe(xr, *ws, None, None, 2, True, "swiglu")
    (yr * dy).sum().backward()
    assert ep_common._rel(y, yr) < ep_common.TOLERANCE
    assert ep_common._rel(x.grad, xr.grad) < ep_common.TOLERANCE
    for p, r in zip((layer.router.weight, layer.w1, layer.w2), ws):
        assert ep_common._rel(p.grad, r.grad) < ep_common.TOLERANCE


def test_arguments():
    with pytest.raises(ValueError, match="top_k"):
        ep_common.ExpertParallelMoE(64, 64, 4, 5, distributed=False, experts="torch")
    with pytest.raises(ValueError, match="experts"):
        ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="nope")


def test_fp8_recipes_are_checked_when_the_layer_is_built():
    from gmjit.torch import ExpertParallelMoE

    m = ExpertParallelMoE(256, 128, 4, 2, distributed=False, recipe="fp8_block", device="meta")
    assert m.recipe == "fp8_block"
    with pytest.raises(ValueError, match="multiples"):
        ExpertParallelMoE(200, 128, 4, 2, distributed=False, recipe="fp8_block", device="meta")
    with pytest.raises(ValueError, match="needs experts='gmjit'"):
        ExpertParallelMoE(256, 128, 4, 2, distributed=False, recipe="fp8_tensor",
                          experts="torch", device="meta")  # fmt: skip
    with pytest.raises(ValueError, match="recipe"):
        ExpertParallelMoE(256, 128, 4, 2, distributed=False, recipe="int8", device="meta")


@pytest.mark.parametrize("experts", ["gmjit", "torch"])
def test_a_layer_survives_torch_save_and_deepcopy(experts):
    import copy
    import io

    layer = ep_common.ExpertParallelMoE(64, 128, 8, 2, distributed=False, experts=experts, seed=3)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    copied = copy.deepcopy(layer)
    for other in (loaded, copied):
        assert other.experts_name == experts and torch.equal(other.w1, layer.w1)
    if experts == "torch":  # runs on the CPU
        x = torch.randn(5, 64, dtype=torch.bfloat16)
        torch.testing.assert_close(loaded(x), layer(x))
        torch.testing.assert_close(copied(x), layer(x))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(hidden=0), "'hidden' must be a positive int"),
        (dict(hidden=60), "'hidden' must be a multiple of 8"),
        (dict(ffn=40, glu_layout="interleaved32"), "'glu_layout' must be 'halves'"),
        (dict(activation="SWIGLU"), "^ExpertParallelMoE: argument 'activation'"),
        (dict(activation="clamped_swiglu", limit=float("nan")), "'limit' must be a finite"),
        (dict(num_experts=8192, top_k=2), "at most 4096"),
        (dict(dtype=torch.float32), "'dtype' must be torch.bfloat16 with experts='gmjit'"),
    ],
)
def test_the_constructor_names_a_bad_argument(kwargs, match):
    args = dict(hidden=64, ffn=64, num_experts=4, top_k=2, distributed=False)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ep_common.ExpertParallelMoE(**args)


def test_a_garbage_world_size_variable_is_named(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match="WORLD_SIZE must be an integer, got 'abc'"):
        ep_common.ExpertParallelMoE(64, 64, 4, 2, experts="torch")


def test_a_meta_layer_runs_a_meta_forward():
    # Shape propagation (model surgery, memory planning) without autocast's meta error.
    layer = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="gmjit",
                                        device="meta", seed=1)  # fmt: skip
    y = layer(torch.empty(10, 64, dtype=torch.bfloat16, device="meta"))
    assert y.shape == (10, 64) and y.device.type == "meta"


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(w1=torch.randn(1, 128, 64)), r"'w1' must be a tensor of shape \[4, 128, 64\]"),
        (dict(w2=torch.randn(8, 64, 64)), r"'w2' must be a tensor of shape \[4, 64, 64\]"),
        (dict(b1=None), "'b1' is required: the layer has bias=True"),
        (dict(w2=None), "'w2' is required$"),
        (dict(b2=torch.randn(4, 32)), r"'b2' must be a tensor of shape \[4, 64\]"),
        (dict(router_weight=torch.randn(4, 32)), r"'router_weight' must be a tensor of shape"),
    ],
)
def test_load_experts_takes_whole_layer_tensors_only(change, match):
    """A one-expert tensor would broadcast into every expert and extra experts be dropped."""
    layer = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch",
                                        bias=True, seed=1)  # fmt: skip
    full = dict(w1=torch.randn(4, 128, 64), w2=torch.randn(4, 64, 64), b1=torch.randn(4, 128),
                b2=torch.randn(4, 64), router_weight=torch.randn(4, 64))  # fmt: skip
    before = layer.w1.detach().clone()
    with pytest.raises(ValueError, match=match):
        layer.load_experts(**{**full, **change})
    assert torch.equal(layer.w1, before)  # refused before anything was copied
    layer.load_experts(**full)
    assert torch.equal(layer.w1, full["w1"].to(layer.w1.dtype))
    plain = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch", seed=1)
    with pytest.raises(ValueError, match="'b1' was given but the layer has bias=False"):
        plain.load_experts(full["w1"], full["w2"], b1=full["b1"])


def test_a_single_process_layer_compiles_without_graph_breaks():
    torch._dynamo.reset()
    layer = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch", seed=1)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    y = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(y, layer(x))


def _compile_and_copy_worker(rank: int, world: int, init_file: str, result_file: str) -> None:
    """Across 2 ranks: torch.compile's gradients equal eager's; double backward equals the
    single-process layer's; deepcopy shares the group, pickling binds the world group again and
    a subgroup's layer, loaded, waits for its group."""
    import copy
    import io

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    failures = []

    def check(name, a, b):
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
            failures.append(f"{name}: |a - b| = {(a - b).abs().max().item():.3g}")

    try:
        make = lambda **kw: ep_common.ExpertParallelMoE(32, 16, 4, 2, experts="torch", seed=1,
                                                        dtype=torch.float32, **kw)  # fmt: skip
        x = torch.randn(6 + rank, 32, generator=torch.Generator().manual_seed(rank))
        grads = {}
        for mode in ("eager", "compiled"):
            torch._dynamo.reset()
            layer, xr = make(), x.clone().requires_grad_()
            run = layer if mode == "eager" else torch.compile(layer, backend="aot_eager")
            run(xr).square().sum().backward()
            grads[mode] = (layer.w1.grad, layer.w2.grad, layer.router.weight.grad, xr.grad)
        for name, a, b in zip(("w1", "w2", "router", "x"), grads["compiled"], grads["eager"]):
            check(f"compiled d{name}", a, b)

        # A gradient penalty: the terms through the exchanges must reach the experts.
        layer, xr = make(), x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(layer(xr).square().sum(), xr, create_graph=True)
        gx.square().sum().backward()
        ref, xr = make(distributed=False), x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(ref(xr).square().sum(), xr, create_graph=True)
        gx.square().sum().backward()
        full = ref.w1.grad.clone()
        dist.all_reduce(full)  # the layer's gradient is that of the sum of the ranks' losses
        mine = slice(layer.first_expert, layer.first_expert + layer.local_experts)
        check("double backward dw1", layer.w1.grad, full[mine])

        layer = make()
        copied = copy.deepcopy(layer)
        if copied.group is not layer.group:
            failures.append("deepcopy did not share the process group")
        buf = io.BytesIO()
        torch.save(layer, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        if loaded.group is not dist.group.WORLD:
            failures.append(f"a loaded world-group layer has group {loaded.group!r}")
        for name, other in (("deepcopy", copied), ("torch.load", loaded)):
            check(f"{name} forward", other(x), layer(x))

        # Every rank loads rank 0's file: only rank 0 holds those experts.
        blobs = [None] * world
        dist.all_gather_object(blobs, buf.getvalue())
        theirs = torch.load(io.BytesIO(blobs[0]), weights_only=False)
        if rank == 0 and theirs.group is not dist.group.WORLD:
            failures.append("rank 0 did not get its own layer back in the world group")
        if rank == 1:
            for attempt in ("as loaded", "in the world group"):
                try:
                    theirs(x)
                    failures.append(f"rank 1 ran rank 0's experts {attempt}")
                except ValueError as e:
                    want = "saved by global rank 0" if attempt == "as loaded" else "of rank 0 of 2"
                    if want not in str(e):
                        failures.append(f"unexpected message {attempt}: {e}")
                if attempt == "as loaded":  # unbound, it still saves and copies
                    torch.save(theirs, io.BytesIO())
                    copy.deepcopy(theirs), copy.copy(theirs)
                    theirs.group = dist.group.WORLD

        alone = dist.new_group([0])  # every rank calls new_group; rank 0 builds the layer
        if rank == 0:
            single = make(group=alone)
            buf = io.BytesIO()
            torch.save(single, buf)
            buf.seek(0)
            loaded = torch.load(buf, weights_only=False)
            try:
                loaded(x)
                failures.append("a loaded subgroup layer ran without its group")
            except ValueError as e:
                if "global ranks [0]" not in str(e):
                    failures.append(f"unexpected message: {e}")
            loaded.group = alone
            check("rebound subgroup forward", loaded(x), single(x))
        if rank == 0:
            with open(result_file, "w") as f:
                f.write("\n".join(failures) if failures else "ok")
    except Exception:
        if rank == 0:
            with open(result_file, "w") as f:
                f.write(traceback.format_exc())
        raise
    finally:
        _leave_group()


def test_compiled_and_double_backward_gradients_and_copies_across_ranks():
    assert _spawn(_compile_and_copy_worker) == "ok"


def test_x_and_seed_are_checked():
    layer = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch", seed=1)
    with pytest.raises(ValueError, match="x must be a floating-point tensor, got torch.int64"):
        layer(torch.ones(3, 64, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"x must be \[..., hidden=64\], got list"):
        layer([[1.0] * 64])
    for bad in (1.0, True, "1"):
        with pytest.raises(ValueError, match="'seed' must be an int or None"):
            ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch", seed=bad)
    np = pytest.importorskip("numpy")
    a = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch",
                                    seed=np.int64(3))  # fmt: skip
    b = ep_common.ExpertParallelMoE(64, 64, 4, 2, distributed=False, experts="torch", seed=3)
    assert torch.equal(a.w1, b.w1) and type(a.seed) is int


def test_torch_experts_compute_in_fp32_under_autocast():
    # The reference and CPU stand-in: autocast would run its matmuls in bf16.
    from gmjit.torch.expert_parallel import torch_experts

    torch.manual_seed(0)
    x, splits = torch.randn(12, 64), torch.tensor([5, 0, 7])
    w1, w2 = torch.randn(3, 256, 64) / 8, torch.randn(3, 64, 128) / 11
    run = torch_experts()
    plain = run(x, splits, w1, w2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = run(x, splits, w1, w2)
    assert autocast.dtype == torch.float32
    torch.testing.assert_close(autocast, plain, rtol=0, atol=0)


def _ddp_worker(rank: int, world: int, init_file: str, result_file: str) -> None:
    """The DDP recipe of docs/EXPERT_PARALLEL.md: DDP averages the router's gradient and leaves
    the experts' (each rank's own) as the layer made them."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        make = lambda: torch.nn.Sequential(ep_common.ExpertParallelMoE(
            32, 16, 4, 2, experts="torch", seed=1, dtype=torch.float32))  # fmt: skip
        x = torch.randn(6 + rank, 32, generator=torch.Generator().manual_seed(rank))
        plain = make()
        plain(x).square().sum().backward()
        router = plain[0].router.weight.grad.clone()
        dist.all_reduce(router)
        model = make()
        names = [n for n, p in model.named_parameters() if getattr(p, "expert_parallel", False)]
        DDP._set_params_and_buffers_to_ignore_for_model(model, names)
        ddp = DDP(model)
        ddp(x).square().sum().backward()
        # The whole layer on every rank: a single-process layer of the same seed's weights.
        full = model[0].gather_experts()
        whole = ep_common.ExpertParallelMoE(32, 16, 4, 2, experts="torch", seed=1,
                                            dtype=torch.float32, distributed=False)  # fmt: skip
        ok = (names == ["0.w1", "0.w2"]
              and torch.allclose(model[0].w1.grad, plain[0].w1.grad)
              and torch.allclose(model[0].router.weight.grad, router / world)
              and torch.equal(full["w1"], whole.w1) and torch.equal(full["w2"], whole.w2)
              and sorted(full) == ["router_weight", "w1", "w2"])  # fmt: skip
        if rank == 0:
            with open(result_file, "w") as f:
                f.write("ok" if ok else "mismatch")
    finally:
        _leave_group()


def test_ddp_averages_the_router_and_gather_experts_gives_the_whole_layer():
    assert _spawn(_ddp_worker) == "ok"


def test_the_expert_mark_survives_copies_meta_init_assign_loads_and_swaps():
    # DDP is told to leave alone the parameters marked expert_parallel: a lost mark averages
    # experts that differ between ranks.
    import copy
    import io

    make = lambda **kw: ep_common.ExpertParallelMoE(32, 32, 4, 2, distributed=False,
                                                    experts="torch", seed=0, bias=True, **kw)  # fmt: skip

    def marked(layer):
        return [n for n, p in layer.named_parameters() if getattr(p, "expert_parallel", False)]

    expected = ["w1", "w2", "b1", "b2"]
    layer = make()
    assert marked(layer) == expected
    assert marked(copy.deepcopy(layer)) == expected
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    assert marked(torch.load(buf, weights_only=False)) == expected
    meta = make(device="meta")
    meta.to_empty(device="cpu")
    assert marked(meta) == expected
    assigned = make(device="meta")
    assigned.load_state_dict(layer.state_dict(), assign=True)
    assert marked(assigned) == expected
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        converted = make().to(torch.float32)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    assert marked(converted) == expected
