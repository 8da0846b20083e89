"""grouped_mlp checks its arguments in Python and names the bad one."""

from __future__ import annotations

import pytest
import torch

from gmjit.torch import grouped_mlp

E, H, F, T = 4, 64, 128, 32


def args(**over):
    a = dict(
        x=torch.randn(T, H, dtype=torch.bfloat16),
        split_sizes=torch.full((E,), T // E, dtype=torch.int64),
        w1=torch.randn(E, 2 * F, H, dtype=torch.bfloat16),
        w2=torch.randn(E, H, F, dtype=torch.bfloat16),
    )
    a.update(over)
    return a


# (override of the valid `args()`, message pattern); test_fast_path.py runs them warm, too.
BAD_ARGUMENTS = [
    (dict(x=torch.randn(T, H)), r"'x' must have dtype torch.bfloat16, got torch.float32"),
    (dict(x=torch.randn(T, H, 1, dtype=torch.bfloat16)), r"'x' must be a 2-D tensor"),
    (dict(x=torch.randn(H, T, dtype=torch.bfloat16).T), r"'x' must be contiguous"),
    (dict(w1=torch.randn(E, F, H, dtype=torch.bfloat16)), r"'w1' must have 2 \* ffn = 256 rows"),
    (dict(w1=torch.randn(E, 2 * F, H + 64, dtype=torch.bfloat16)), r"'w1' must have shape \[4, 256, 64\]"),
    (dict(w2=torch.randn(E, H, F)), r"'w2' must have dtype torch.bfloat16"),
    (dict(w2=torch.randn(E + 1, H, F, dtype=torch.bfloat16)), r"'w2' must have shape \[4, 64, 128\]"),
    (dict(split_sizes=torch.ones(E)), r"'split_sizes' must have dtype torch.int32 or torch.int64"),
    (dict(split_sizes=torch.ones(E + 1, dtype=torch.int32)), r"'split_sizes' must have shape \[4\]"),
    (dict(split_sizes=[8, 8, 8, 8]), r"'split_sizes' must be a torch.Tensor"),
    (dict(b1=torch.zeros(E, F, dtype=torch.bfloat16)), r"'b1' must have shape \[4, 256\]"),
    (dict(b2=torch.zeros(E, H)), r"'b2' must have dtype torch.bfloat16"),
    (dict(probs=torch.ones(T, dtype=torch.bfloat16)), r"'probs' must have dtype torch.float32"),
    (dict(probs=torch.ones(T + 1)), r"'probs' must have shape \[32\]"),
    (dict(probs=torch.ones(T, 2)[:, 0]), r"'probs' must be contiguous"),
    (dict(activation="silu"), r"'activation' must be one of"),
    (dict(glu_layout="interleaved"), r"'glu_layout' must be one of"),
    (dict(activation=["swiglu"]), r"'activation' must be one of"),  # unhashable, not a name
    (dict(glu_layout=["halves"]), r"'glu_layout' must be one of"),
]


@pytest.mark.parametrize("override, pattern", BAD_ARGUMENTS)
def test_bad_argument_is_named_in_a_value_error(override, pattern):
    with pytest.raises(ValueError, match=pattern):
        grouped_mlp(**args(**override))


def test_widths_that_are_not_multiples_of_8_are_rejected():
    a = args(x=torch.randn(T, 100, dtype=torch.bfloat16), w1=torch.randn(E, 2 * F, 100, dtype=torch.bfloat16),
             w2=torch.randn(E, 100, F, dtype=torch.bfloat16))  # fmt: skip
    with pytest.raises(ValueError, match="multiples of 8"):
        grouped_mlp(**a)


def test_non_glu_activation_wants_ffn_rows_in_w1():
    with pytest.raises(ValueError, match=r"'w1' must have ffn = 128 rows"):
        grouped_mlp(**args(), activation="relu")
    w1 = torch.randn(E, F, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA device"):  # shapes fine: only the device is left
        grouped_mlp(**args(w1=w1), activation="relu")


def test_valid_cpu_tensors_fail_only_on_the_device():
    with pytest.raises(ValueError, match=r"'x' must be on a CUDA device to run, got cpu"):
        grouped_mlp(**args())


def test_tensors_on_another_device_than_x_are_named():
    with pytest.raises(ValueError, match=r"'w2' must be on cpu \(where x is\), got meta"):
        grouped_mlp(**args(w2=torch.empty(E, H, F, dtype=torch.bfloat16, device="meta")))


def test_zero_tokens_need_no_device_and_give_an_empty_output():
    a = args(x=torch.empty(0, H, dtype=torch.bfloat16), split_sizes=torch.zeros(E, dtype=torch.int64))
    y = grouped_mlp(**a)
    assert y.shape == (0, H) and y.dtype == torch.bfloat16


def layer(experts=E, hidden=H, ffn=F, tokens=T, device="cpu", glu=True):
    """A call's tensors for a layer of these sizes (meta: too large to allocate)."""
    bf = dict(dtype=torch.bfloat16, device=device)
    return dict(x=torch.empty(tokens, hidden, **bf),
                split_sizes=torch.zeros(experts, dtype=torch.int64, device=device),
                w1=torch.empty(experts, 2 * ffn if glu else ffn, hidden, **bf),
                w2=torch.empty(experts, hidden, ffn, **bf))  # fmt: skip


# The engine's limits (codegen check_supported): rejected whatever the token count.
LAYER_LIMITS = [
    (dict(experts=0), {}, r"'w1' must hold 1 to 4096 experts .* got 0"),
    (dict(experts=4097, device="meta"), {}, r"'w1' must hold 1 to 4096 experts .* got 4097"),
    (dict(hidden=0), {}, r"'w2' .* hidden \(0\) and ffn \(128\) positive multiples of 8"),
    (dict(ffn=0), {}, r"'w2' .* hidden \(64\) and ffn \(0\) positive multiples of 8"),
    (dict(hidden=(1 << 20) + 8, device="meta", experts=1, ffn=8), {}, r"at most 1048576"),
    (dict(ffn=24), dict(glu_layout="interleaved32"), r"'glu_layout' must be 'halves' when ffn \(24\)"),
    # clamped_swiglu's limit and alpha are literals of the kernel's source.
    ({}, dict(activation="clamped_swiglu", limit=float("nan")), r"'limit' must be a finite .* 0"),
    ({}, dict(activation="clamped_swiglu", limit=0.0), r"'limit' must be a finite number above 0"),
    ({}, dict(activation="clamped_swiglu", alpha=float("inf")), r"'alpha' must be a finite"),
    # Not numbers at all: named whatever the activation.
    ({}, dict(limit="a"), r"'limit' must be a real number, got 'a'"),
    ({}, dict(alpha=10**400), r"'alpha' must be a real number a float can hold, got 1000"),
    ({}, dict(activation="clamped_swiglu", alpha=None), r"'alpha' must be a real number"),
]


def test_numpy_scalars_are_numbers_too():
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match="CUDA device"):  # past every argument check
        grouped_mlp(**layer(), activation="clamped_swiglu", limit=np.float32(7.0),
                    alpha=np.float64(1.702))  # fmt: skip


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("tokens", [0, T])
@pytest.mark.parametrize("sizes, options, pattern", LAYER_LIMITS)
def test_layers_beyond_the_engine_limits_are_rejected_with_or_without_tokens(
    sizes, options, pattern, tokens, fast, monkeypatch
):
    from op_globals import patch_op_globals

    # the eager path CUDA tensors take; _entries: wherever the op reads it (op_globals.py)
    patch_op_globals(monkeypatch, _FAST_ON_CPU=fast, _entries={})
    with pytest.raises(ValueError, match=pattern):
        grouped_mlp(**layer(**sizes, tokens=tokens), **options)


def test_interleaved32_with_ffn_a_multiple_of_32_and_non_glu_layers_pass_the_layer_checks():
    with pytest.raises(ValueError, match="CUDA device"):
        grouped_mlp(**layer(ffn=96), glu_layout="interleaved32")
    with pytest.raises(ValueError, match="CUDA device"):  # the layout means nothing without a GLU
        grouped_mlp(**layer(ffn=24, glu=False), activation="relu", glu_layout="interleaved32")


def meta_call(**over):
    a = layer(device="meta")
    a.update(over)
    return a


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def forward_op(call, activation="swiglu", save=False):
    return torch.ops.gmjit.grouped_mlp(*call.values(), None, None, None, activation, "halves",
                                       7.0, 1.702, save)  # fmt: skip


# The custom ops are public (torch.ops.gmjit.*): called on meta (or fake) tensors their fake
# kernels run, with the checks the real kernels run.
@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: forward_op(meta_call(), "SWIGLU"), r"'activation' must be one of"),
        (lambda: forward_op(meta_call(w1=meta(E, 100, H)), save=True),
         r"'w1' must have 2 \* ffn = 256 rows"),
        (lambda: forward_op(meta_call(x=meta(T, H, 2))), r"'x' must be a 2-D tensor"),
        (lambda: torch.ops.gmjit.quantize_weights(meta(E, 256, 128), meta(E, 128, 128), "bf16"),
         r"'recipe' must be an FP8 recipe"),
        (lambda: torch.ops.gmjit.grouped_mlp_backward(
            meta(T, H), *meta_call().values(), None, None, meta(T, 2 * F), "swiglu", "halves",
            7.0, 1.702, False, [True]),
         r"'wanted' must hold 6 flags"),
    ],
)
def test_the_custom_ops_check_meta_tensors_as_real_ones(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_valid_meta_calls_of_the_custom_ops_give_the_shapes():
    y, saved = forward_op(meta_call(), save=True)
    assert y.shape == (T, H) and saved.shape == (T, 2 * F)


def test_accumulate_main_grad_is_refused_only_where_a_backward_would_need_it():
    # A meta module (shapes only) and a no-grad call under a tracer compute no gradient.
    t = layer(device="meta")
    w1 = t["w1"].requires_grad_()
    with torch.no_grad():
        y = grouped_mlp(**t, accumulate_main_grad=True)
    assert y.shape == (T, H) and y.device.type == "meta"
    with pytest.raises(ValueError, match="accumulate_main_grad=True works only on the eager path"):
        grouped_mlp(**t, accumulate_main_grad=True)
    assert w1.requires_grad


def test_clamped_swiglu_traces_with_dynamic_shapes_in_one_graph():
    # dynamic=True makes the module's float limit symbolic; checking it must not break the
    # graph (the trace then reaches the call, which needs a GPU).
    from gmjit.torch import GroupedMLP

    torch._dynamo.reset()
    m = GroupedMLP(E, H, F, activation="clamped_swiglu", limit=6.0)
    run = torch.compile(m, backend="eager", fullgraph=True, dynamic=True)
    with pytest.raises(ValueError, match="'x' must be on a CUDA device"):
        run(torch.randn(T, H, dtype=torch.bfloat16), torch.tensor([T // E] * E))


def test_a_modules_repr_shows_the_options_that_change_its_output():
    from gmjit.torch import GroupedMLP

    plain = repr(GroupedMLP(E, H, F, device="meta"))
    assert "limit" not in plain and "glu_layout" not in plain
    text = repr(GroupedMLP(E, H, F, activation="clamped_swiglu", glu_layout="interleaved32",
                           limit=5.0, alpha=1.5, accumulate_main_grad=True, device="meta"))  # fmt: skip
    for part in ("glu_layout=interleaved32", "limit=5.0, alpha=1.5", "accumulate_main_grad=True"):
        assert part in text, text
