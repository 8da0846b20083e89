"""Weight layout conversions: what each helper means, and their round trips."""

from __future__ import annotations

import pytest
import torch

import reference
from gmjit.torch import GroupedMLP, layouts

E, H, F = 3, 64, 64


def test_transposed_interleaved_gate_up_becomes_halves():
    gate = torch.randn(E, F, H)
    up = torch.randn(E, F, H)
    # gpt-oss: [E, H, 2F] with gate and up alternating along the last dimension.
    fused = torch.stack((gate, up), dim=2).reshape(E, 2 * F, H).transpose(1, 2)
    w1 = layouts.fc1_from_gate_up(fused, transposed=True, interleaved=True)
    assert torch.equal(w1, torch.cat((gate, up), dim=1)) and w1.is_contiguous()
    back = layouts.gate_up_from_fc1(w1, transposed=True, interleaved=True)
    assert torch.equal(back, fused)


def test_concatenated_gate_up_is_already_gmjits_layout():
    fused = torch.randn(E, 2 * F, H)
    assert torch.equal(layouts.fc1_from_gate_up(fused), fused)
    assert torch.equal(layouts.fc1_from_gate_and_up(*fused.chunk(2, dim=1)), fused)


def test_interleaved_bias_becomes_halves():
    b = torch.arange(2 * F).repeat(E, 1)
    b1 = layouts.fc1_bias_from_gate_up(b, interleaved=True)
    assert torch.equal(b1[0, :F], torch.arange(0, 2 * F, 2))
    assert torch.equal(b1[0, F:], torch.arange(1, 2 * F, 2))
    for interleaved in (False, True):  # and back, for an export to the model's layout
        there = layouts.fc1_bias_from_gate_up(b, interleaved=interleaved)
        assert torch.equal(layouts.gate_up_bias_from_fc1(there, interleaved=interleaved), b)


def test_down_projection_transposes():
    down = torch.randn(E, F, H)
    assert torch.equal(layouts.fc2_from_down(down, transposed=True), down.transpose(1, 2))
    assert torch.equal(layouts.down_from_fc2(layouts.fc2_from_down(down, transposed=True),
                                             transposed=True), down)  # fmt: skip


def test_megatron_experts_stack():
    fc1 = [torch.randn(2 * F, H) for _ in range(E)]
    assert torch.equal(layouts.stack_experts(fc1)[1], fc1[1])
    with pytest.raises(ValueError):
        layouts.stack_experts([])


def test_interleaved32_round_trip_and_meaning():
    w1 = torch.randn(E, 2 * F, H)
    inter = layouts.halves_to_interleaved32(w1)
    assert torch.equal(inter[:, :32], w1[:, :32]) and torch.equal(inter[:, 32:64], w1[:, F : F + 32])
    assert torch.equal(layouts.interleaved32_to_halves(inter), w1)
    b = torch.randn(E, 2 * F)
    assert torch.equal(layouts.interleaved32_to_halves(layouts.halves_to_interleaved32(b)), b)


def test_interleaved32_weights_give_the_same_layer_output():
    x = torch.randn(8, H, dtype=torch.float64)
    split = torch.tensor([3, 5, 0])
    w1 = torch.randn(E, 2 * F, H, dtype=torch.float64)
    w2 = torch.randn(E, H, F, dtype=torch.float64)
    halves = reference.grouped_mlp(x, split, w1, w2)
    inter = reference.grouped_mlp(x, split, layouts.halves_to_interleaved32(w1), w2,
                                  glu_layout="interleaved32")  # fmt: skip
    torch.testing.assert_close(halves, inter)


def test_conversions_are_differentiable():
    fused = torch.randn(E, H, 2 * F, requires_grad=True)
    layouts.fc1_from_gate_up(fused, transposed=True, interleaved=True).sum().backward()
    assert torch.equal(fused.grad, torch.ones_like(fused))


@pytest.mark.parametrize("loader", ["gate_up", "megatron"])
def test_module_loaders_write_the_modules_own_glu_layout(loader):
    from gmjit.torch import GroupedMLP

    gate, up = torch.randn(E, F, H), torch.randn(E, F, H)
    down = torch.randn(E, H, F)
    b_gate, b_up = torch.randn(E, F), torch.randn(E, F)
    halves = torch.cat((gate, up), dim=1)
    b_halves = torch.cat((b_gate, b_up), dim=1)
    for glu_layout in ("halves", "interleaved32"):
        m = GroupedMLP(E, H, F, "swiglu", bias=True, glu_layout=glu_layout, device="cpu")
        if loader == "gate_up":
            m.load_gate_up(halves, down, b_halves, torch.zeros(E, H))
        else:
            m.load_megatron(list(halves), list(down), list(b_halves), list(torch.zeros(E, H)))
        want_w1, want_b1 = halves, b_halves
        if glu_layout == "interleaved32":
            want_w1 = layouts.halves_to_interleaved32(halves, dim=1)
            want_b1 = layouts.halves_to_interleaved32(b_halves, dim=1)
        assert torch.equal(m.w1, want_w1.to(m.w1.dtype)), glu_layout
        assert torch.equal(m.b1, want_b1.to(m.b1.dtype)), glu_layout


@pytest.mark.parametrize("args, kwargs, pattern", [
    ((0, 64, 64), {}, r"'num_experts' must be 1 to 4096, got 0"),
    ((5000, 8, 8), {}, r"'num_experts' must be 1 to 4096, got 5000"),
    ((3, 60, 64), {}, r"'hidden' must be a multiple of 8 .* got 60"),
    ((3, 64, 0), {}, r"'ffn' must be a multiple of 8 .* got 0"),
    ((3, 64, 48), dict(glu_layout="interleaved32"), r"'glu_layout' must be 'halves' when ffn \(48\)"),
])  # fmt: skip
def test_module_rejects_sizes_the_engine_cannot_run_when_built(args, kwargs, pattern):
    # Not at the first call, after the weights were made and loaded.
    with pytest.raises(ValueError, match=pattern):
        GroupedMLP(*args, **kwargs, device="meta")
    GroupedMLP(3, 64, 48, activation="relu", glu_layout="interleaved32", device="meta")


@pytest.mark.parametrize("fn", [layouts.halves_to_interleaved32, layouts.interleaved32_to_halves])
def test_a_negative_dim_means_what_it_means_in_torch(fn):
    w1 = torch.randn(2, 128, 16)
    assert torch.equal(fn(w1, dim=-2), fn(w1, dim=1))
    b1 = torch.randn(2, 128)
    assert torch.equal(fn(b1, dim=-1), fn(b1, dim=1))
    with pytest.raises(ValueError, match="argument 'dim' must be in"):
        fn(b1, dim=2)


def test_module_loaders_name_the_argument_of_a_wrong_shape():
    m = GroupedMLP(E, H, F, bias=True)
    gate_up = torch.randn(E, 2 * F, H)
    down = torch.randn(E, H, F)
    with pytest.raises(ValueError, match=r"load_gate_up: argument 'down' gives w2 of shape "
                                         r"\[3, 64, 32\], but this module's w2 is \[3, 64, 64\]"):
        m.load_gate_up(gate_up, down[..., :32])
    with pytest.raises(ValueError, match=r"load_gate_up: argument 'gate_up_bias' gives b1"):
        m.load_gate_up(gate_up, down, torch.randn(E, F))
    with pytest.raises(ValueError, match=r"load_megatron: argument 'fc1_weights' gives w1 of "
                                         r"shape \[2, 128, 64\]"):
        m.load_megatron([gate_up[0], gate_up[1]], list(down))
    with pytest.raises(ValueError, match="interleaved=True is for gated"):
        GroupedMLP(E, H, F, "relu").load_gate_up(torch.randn(E, F, H), down, interleaved=True)
    # Not a bool: named as such, not taken for its truth value ("False" is true).
    with pytest.raises(ValueError, match="load_gate_up: argument 'interleaved' must be a bool"):
        GroupedMLP(E, H, F, "relu").load_gate_up(torch.randn(E, F, H), down, interleaved="False")


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_is_refused_with_what_to_use_instead():
    for module in (GroupedMLP(E, H, F), torch.nn.Sequential(GroupedMLP(E, H, F))):
        with pytest.raises(RuntimeError, match="use torch.compile"):
            torch.jit.script(module)
