"""grouped_mlp on layers drawn at random: any width the contract allows (multiples of 8), any
expert count and load (empty experts, one token, rows past the splits), every activation, with
and without biases and router probabilities, checked per expert against float64.

A norm over the whole output would hide one wrong expert among many right ones, so every expert's
rows and every expert's weight gradients are compared on their own. GMJIT_RANDOM_LAYERS sets the
count (default 24), GMJIT_RANDOM_SEED the first seed; a failure names the seed and the layer.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

import reference
from gmjit.torch import grouped_mlp

pytestmark = pytest.mark.gpu

GLU = ("swiglu", "geglu", "clamped_swiglu")
ACTIVATIONS = GLU + ("srelu", "gelu", "relu")
COUNT = int(os.environ.get("GMJIT_RANDOM_LAYERS", "24"))
FIRST_SEED = int(os.environ.get("GMJIT_RANDOM_SEED", "1000"))


def draw_width(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.3:
        return 8 * rng.randint(1, 40)  # narrow: 8..320, any multiple of 8
    if kind < 0.6:
        return 8 * rng.randint(40, 400)  # up to 3200, often not a multiple of 64
    return 128 * rng.randint(1, 24)


def draw_splits(rng: random.Random, experts: int) -> list[int]:
    regime = rng.choice(("decode", "prefill", "mixed", "one-hot"))
    if regime == "decode":
        return [rng.choice((0, 1, 2, 3, 7, 16)) for _ in range(experts)]
    if regime == "one-hot":  # every token on one expert
        splits = [0] * experts
        splits[rng.randrange(experts)] = rng.randint(1, 700)
        return splits
    top = 300 if regime == "prefill" else 40
    return [0 if rng.random() < 0.2 else rng.randint(1, top) for _ in range(experts)]


def draw_layer(seed: int) -> dict:
    rng = random.Random(seed)
    activation = rng.choice(ACTIVATIONS)
    hidden = draw_width(rng)
    ffn = draw_width(rng)
    layout = "halves"
    if activation in GLU and ffn % 32 == 0 and rng.random() < 0.3:
        layout = "interleaved32"
    # Keep the float64 reference cheap: fewer experts for wide layers.
    experts = rng.choice((1, 2, 3, 5, 8, 17, 64) if hidden * ffn < 2**21 else (1, 2, 3, 5, 8))
    splits = draw_splits(rng, experts)
    return dict(seed=seed, activation=activation, layout=layout, hidden=hidden, ffn=ffn,
                splits=splits, tail=rng.choice((0, 0, 1, 5)), bias=rng.random() < 0.4,
                probs=rng.random() < 0.6, split_dtype=rng.choice((torch.int32, torch.int64)),
                limit=rng.choice((7.0, 3.5)), alpha=rng.choice((1.702, 1.0)))  # fmt: skip


def make_tensors(layer: dict) -> dict:
    g = torch.Generator(device="cuda").manual_seed(layer["seed"])
    E, H, F = len(layer["splits"]), layer["hidden"], layer["ffn"]
    F1 = 2 * F if layer["activation"] in GLU else F
    T = sum(layer["splits"]) + layer["tail"]

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    return dict(
        x=rnd(T, H),
        split_sizes=torch.tensor(layer["splits"], dtype=layer["split_dtype"], device="cuda"),
        w1=rnd(E, F1, H, scale=H**-0.5),
        w2=rnd(E, H, F, scale=F**-0.5),
        b1=rnd(E, F1, scale=0.1) if layer["bias"] else None,
        b2=rnd(E, H, scale=0.1) if layer["bias"] else None,
        probs=torch.rand(T, generator=g, device="cuda") if layer["probs"] else None,
    )


def close(got: torch.Tensor, want: torch.Tensor, tol: float, floor: float = 0.0) -> bool:
    """Relative error in the Frobenius norm; `floor` (and 1e-3 per element) bounds the scale from
    below, for references near zero (an expert whose rows all got probability ~0)."""
    got, want = got.double(), want.double()
    scale = max(want.norm().item(), floor, 1e-3 * max(1.0, want.numel()) ** 0.5)
    return (got - want).norm().item() <= tol * scale


LAYERS = [draw_layer(FIRST_SEED + i) for i in range(COUNT)]


def describe(layer: dict) -> str:
    return (f"seed {layer['seed']}: {layer['activation']}/{layer['layout']} H={layer['hidden']} "
            f"F={layer['ffn']} E={len(layer['splits'])} splits={layer['splits']} "
            f"tail={layer['tail']} bias={layer['bias']} probs={layer['probs']}")  # fmt: skip


def run(t: dict, **kw) -> tuple[torch.Tensor, dict]:
    """The op's output and the gradients of its floating inputs for dy (seeded)."""
    leaves = {k: (v.clone().requires_grad_() if v is not None and v.is_floating_point() else v)
              for k, v in t.items()}  # fmt: skip
    y = grouped_mlp(**leaves, **kw)
    dy = torch.randn(y.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    y.backward(dy.to(y.dtype))
    grads = {k: v.grad for k, v in leaves.items() if v is not None and v.is_floating_point()}
    return y.detach(), grads


def reference_run(t: dict, layer: dict) -> tuple[torch.Tensor, dict]:
    """The same in float64 (the same seeded dy, rounded to bf16 as the op's is)."""
    leaves = {k: (v.detach().double().requires_grad_() if v is not None and v.is_floating_point()
                  else v) for k, v in t.items()}  # fmt: skip
    y = reference.grouped_mlp(leaves["x"], leaves["split_sizes"].cpu(), leaves["w1"],
                              leaves["w2"], leaves["b1"], leaves["b2"], leaves["probs"],
                              layer["activation"], layer["layout"], layer["limit"],
                              layer["alpha"])  # fmt: skip
    dy = torch.randn(y.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    y.backward(dy.to(torch.bfloat16).double())
    grads = {k: v.grad for k, v in leaves.items() if v is not None and v.is_floating_point()}
    return y.detach(), grads


def check_rows(what: str, got: torch.Tensor, want: torch.Tensor, splits: list, tol: float):
    """Each expert's rows on their own; rows past the splits exactly zero. An expert's error is
    measured against its rows' share of the whole's norm where that is larger: one token's
    dprobs is a single dot product of H bf16 terms, whose rounding can be a few percent of a
    value that happens to be small."""
    used = sum(splits)
    whole = want[:used].double().norm().item()
    start = 0
    for e, n in enumerate(splits):
        if n:
            share = whole * (n / used) ** 0.5
            assert close(got[start : start + n], want[start : start + n], tol, share), (
                f"{what}, expert {e}")
        start += n
    tail = got[start:]
    assert tail.numel() == 0 or tail.abs().max().item() == 0, f"{what}: rows past the splits"


def check_gradients(what: str, got: dict, want: dict, splits: list, tol: float):
    assert got.keys() == want.keys(), what
    for name, g in got.items():
        w = want[name]
        assert g is not None and g.shape == w.shape, f"{what}: d{name}"
        assert torch.isfinite(g).all(), f"{what}: d{name} not finite"
        if name in ("x", "probs"):
            check_rows(f"{what}: d{name}", g, w, splits, tol)
            continue
        for e, n in enumerate(splits):  # weights and biases: an expert without tokens gets zero
            if n:
                assert close(g[e], w[e], tol), f"{what}: d{name} of expert {e}"
            else:
                assert g[e].abs().max().item() == 0, f"{what}: d{name} of empty expert {e}"


def options(layer: dict) -> dict:
    return dict(activation=layer["activation"], glu_layout=layer["layout"],
                limit=layer["limit"], alpha=layer["alpha"])  # fmt: skip


@pytest.mark.parametrize("layer", LAYERS, ids=[f"seed{layer['seed']}" for layer in LAYERS])
def test_random_layer_matches_float64_per_expert(layer):
    what = describe(layer)
    t = make_tensors(layer)
    with torch.no_grad():
        y_infer = grouped_mlp(**t, **options(layer))
    y, grads = run(t, **options(layer))
    ref, ref_grads = reference_run(t, layer)
    assert y.shape == ref.shape and y_infer.shape == ref.shape, what
    check_rows(f"{what}: forward (grad mode)", y, ref, layer["splits"], 1e-2)
    check_rows(f"{what}: forward (no grad)", y_infer, ref, layer["splits"], 1e-2)
    check_gradients(what, grads, ref_grads, layer["splits"], 2e-2)


def draw_fp8_layer(seed: int) -> dict:
    """A layer the FP8 recipes take: widths multiples of 128, the halves GLU layout."""
    layer = draw_layer(seed)
    rng = random.Random(seed + 1)
    layer.update(hidden=128 * rng.randint(1, 16), ffn=128 * rng.randint(1, 16), layout="halves",
                 recipe=rng.choice(("fp8_block", "fp8_block_pow2", "fp8_tensor")))
    return layer


FP8_LAYERS = [draw_fp8_layer(FIRST_SEED + 5000 + i) for i in range(max(COUNT // 3, 1))]


@pytest.mark.parametrize("layer", FP8_LAYERS, ids=[f"seed{layer['seed']}" for layer in FP8_LAYERS])
def test_random_fp8_layer_tracks_bf16_per_expert(layer):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 recipes need sm_90a")
    what = f"{layer['recipe']} {describe(layer)}"
    t = make_tensors(layer)
    y8, g8 = run(t, recipe=layer["recipe"], **options(layer))
    ref, _ = reference_run(t, layer)
    _, g16 = run(t, **options(layer))
    check_rows(f"{what}: forward", y8, ref, layer["splits"], 0.1)
    check_gradients(what, g8, g16, layer["splits"], 0.2)
