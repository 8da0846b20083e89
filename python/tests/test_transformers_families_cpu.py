"""Every experts class of the installed transformers that goes through the experts interface.

The classes are found at import time: every nn.Module of a transformers modeling module whose
`forward` is the one `use_experts_implementation` installs. Each gets a tiny random config (its
own config class with default activation and limits; hidden 64, ffn 48, 4 experts, top-2) and
must either take gmjit's plan, with gmjit's whole Python path (permutation, layouts, probs,
un-permutation; the float64 reference MLP in place of the GPU kernels) equal to the module's own
eager loop in float64, or fall back with a reason that names what gmjit cannot run, the fallback
through the registered "gmjit" entry point then equal to eager.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pathlib
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import reference  # noqa: E402

import gmjit.transformers as gt  # noqa: E402

HIDDEN, FFN, EXPERTS, TOP_K, TOKENS = 64, 48, 4, 2, 24
# Config fields that size an experts module, set where the config class has them.
TINY = dict(hidden_size=HIDDEN, intermediate_size=FFN, moe_intermediate_size=FFN,
            num_experts=EXPERTS, num_local_experts=EXPERTS, n_routed_experts=EXPERTS,
            moe_num_experts=EXPERTS, num_experts_per_tok=TOP_K)  # fmt: skip
# transformers 5.17 has 55; fewer than this means discovery broke, not that families went away.
MIN_CLASSES = 45
# Families whose path is known: the sweep cannot pass with every family falling back, and each
# of gmjit's activations is exercised by at least one real module.
EXPECTED_ACTIVATION = {
    "mixtral.MixtralExperts": "swiglu",
    "qwen2_moe.Qwen2MoeExperts": "swiglu",
    "qwen3_moe.Qwen3MoeExperts": "swiglu",
    "deepseek_v3.DeepseekV3Experts": "swiglu",
    "olmoe.OlmoeExperts": "swiglu",
    "gpt_oss.GptOssExperts": "clamped_swiglu",  # transposed, interleaved, biases
    "gemma4.Gemma4TextExperts": "geglu",
    "nemotron_h.NemotronHExperts": "srelu",  # has_gate=False
}

# Which config class builds a class, where the first candidate (the __init__ annotation, then
# "Text" configs) is wrong: the annotation says the composite Qwen3OmniMoeThinkerConfig, the
# thinker's text model (config_class) passes Qwen3OmniMoeTextConfig.
CONFIG_CLASS = {"qwen3_omni_moe.Qwen3OmniMoeThinkerTextExperts": "Qwen3OmniMoeTextConfig"}
# Config fields and __init__ arguments beyond TINY: Ernie 4.5 VL keeps [text, vision] expert
# widths in one list and its MoE block passes one of them to the experts.
CONFIG_FIELDS = {"ernie4_5_vl_moe.Ernie4_5_VLMoeMoeExperts": dict(moe_intermediate_size=[FFN, FFN])}
INIT_KWARGS = {"ernie4_5_vl_moe.Ernie4_5_VLMoeMoeExperts": dict(intermediate_size=FFN)}
# Extra cases: (class, config fields). NemotronH's experts run in a latent width, not hidden;
# MiniMax-M3-VL's gpt-oss-style gate with other swiglu_alpha/limit than gpt-oss's constants.
VARIANTS = {
    "nemotron_h.NemotronHExperts[latent32]": ("nemotron_h.NemotronHExperts",
                                              dict(moe_latent_size=32)),
    "minimax_m3_vl.MiniMaxM3VLExperts[alpha1.5,limit5]": ("minimax_m3_vl.MiniMaxM3VLExperts",
                                                          dict(swiglu_alpha=1.5, swiglu_limit=5.0)),
}  # fmt: skip
# Eager forwards that compute in float32 whatever the weights' dtype: compared at float32's
# tolerance (and, like every case, with transformers' batched_mm in float64 at float64's).
EAGER_FP32 = {"openai_privacy_filter.OpenAIPrivacyFilterExperts"}
# Classes that cannot be built tiny, with the reason (none in transformers 5.17).
SKIPS: dict[str, str] = {}
# Defects of gmjit.transformers, per test: strict xfails (they fail loudly once fixed). None
# today (Lfm2-MoE's plain-function F.silu gate was one until _act_name learnt functions).
XFAILS: dict[str, dict[str, str]] = {}


def _interface_forward_code():
    """The code of the `forward` that use_experts_implementation puts on a class."""
    from transformers.integrations.moe import use_experts_implementation

    class Probe(torch.nn.Module):
        def forward(self, *args):
            raise NotImplementedError

    return use_experts_implementation(Probe).forward.__code__


def _discover() -> tuple[dict[str, type], dict[str, str]]:
    """{"<model dir>.<class name>": class} for every class behind the experts interface, and the
    modeling modules that failed to import. Modules that mention neither the decorator nor an
    "Experts" class (imported from another model or not) hold none and are not imported."""
    code = _interface_forward_code()
    found, errors = {}, {}
    root = pathlib.Path(transformers.__file__).parent / "models"
    for path in sorted(root.glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        if "Experts" not in text and "use_experts_implementation" not in text:
            continue
        name = f"transformers.models.{path.parent.name}.{path.stem}"
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - reported by test_discovery_finds_the_families
            errors[name] = f"{type(e).__name__}: {e}"
            continue
        for cls_name, cls in vars(module).items():
            if not (inspect.isclass(cls) and cls.__module__ == name):
                continue
            if getattr(getattr(cls, "forward", None), "__code__", None) is code:
                found[f"{path.parent.name}.{cls_name}"] = cls
    return found, errors


CLASSES, IMPORT_ERRORS = _discover()
CASES = sorted(CLASSES) + sorted(v for v, (base, _) in VARIANTS.items() if base in CLASSES)


def _params(test: str) -> list:
    out = []
    for case in CASES:
        marks = []
        if case in SKIPS:
            marks.append(pytest.mark.skip(reason=SKIPS[case]))
        if case in XFAILS.get(test, {}):
            marks.append(pytest.mark.xfail(reason=XFAILS[test][case], strict=True))
        out.append(pytest.param(case, marks=marks, id=case))
    return out


def _config_candidates(key: str, cls: type) -> list[type]:
    from transformers import PretrainedConfig

    module = sys.modules[cls.__module__]
    found = {c for c in vars(module).values()
             if inspect.isclass(c) and issubclass(c, PretrainedConfig)} - {PretrainedConfig}
    annotation = inspect.signature(cls.__init__).parameters["config"].annotation
    if key in CONFIG_CLASS:
        return [c for c in found if c.__name__ == CONFIG_CLASS[key]]
    return sorted(found, key=lambda c: (c is not annotation, "Text" not in c.__name__, c.__name__))


def _weights_shape_ok(m: torch.nn.Module, hidden: int) -> bool:
    up = getattr(m, "gate_up_proj" if m.has_gate else "up_proj")
    h, f1 = (up.shape[1], up.shape[2]) if m.is_transposed else (up.shape[2], up.shape[1])
    return up.shape[0] == EXPERTS and h == hidden and f1 == (2 * FFN if m.has_gate else FFN)


def build(case: str, seed: int = 0) -> torch.nn.Module:
    """The case's experts module, tiny, random (biases too), bfloat16, eager."""
    key, extra = VARIANTS.get(case, (case, {}))
    cls = CLASSES[key]
    fields = {**CONFIG_FIELDS.get(key, {}), **extra}
    tried = []
    for config_cls in _config_candidates(key, cls):
        try:
            config = config_cls()
            for field, value in {**{f: v for f, v in TINY.items() if hasattr(config, f)},
                                 **fields}.items():
                setattr(config, field, value)
            config._experts_implementation = "eager"
            with torch.device("meta"):  # nothing allocated before the sizes are checked
                meta = cls(config, **INIT_KWARGS.get(key, {}))
        except Exception as e:  # noqa: BLE001 - the next candidate, or the error below
            tried.append(f"{config_cls.__name__}: {type(e).__name__}: {e}")
            continue
        hidden = fields.get("moe_latent_size") or HIDDEN
        if not _weights_shape_ok(meta, hidden):
            tried.append(f"{config_cls.__name__}: not sized by {sorted(TINY)}: "
                         f"{[tuple(p.shape) for p in meta.parameters()]}")  # fmt: skip
            continue
        gen = torch.Generator().manual_seed(seed)
        m = cls(config, **INIT_KWARGS.get(key, {}))
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        return m.to(torch.bfloat16)
    raise AssertionError(f"no config builds {key} tiny: {tried}")


def _inputs(m: torch.nn.Module, dtype: torch.dtype, seed: int = 1):
    up = getattr(m, "gate_up_proj" if m.has_gate else "up_proj")
    hidden = up.shape[1] if m.is_transposed else up.shape[2]
    gen = torch.Generator().manual_seed(seed)
    # x * 4: FC1 pre-activations of std ~3, across gpt-oss's clamps at +-7.
    x = (torch.randn(TOKENS, hidden, generator=gen) * 4).to(dtype)
    idx = torch.stack([torch.randperm(m.num_experts, generator=gen)[:TOP_K] for _ in range(TOKENS)])
    # fp32 router weights (gmjit takes probs in fp32): exact in float64 as well.
    w = torch.rand(TOKENS, TOP_K, generator=gen).to(dtype)
    return x, idx, w


def _reference_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation, limit, alpha):
    return reference.grouped_mlp(x, split_sizes, w1, w2, b1, b2, probs, activation, "halves",
                                 limit, alpha).to(x.dtype)  # fmt: skip


def _causes(m: torch.nn.Module) -> set[str]:
    """Names a fallback reason can give for what gmjit cannot run in this module."""
    names = {str(p.dtype) for p in m.parameters()}
    gate = getattr(type(m), "_apply_gate", None)
    if gate is not None and gate is not gt._DEFAULT_APPLY_GATE:
        names.add(gate.__qualname__)
    act = getattr(m, "act_fn", None)
    if act is not None:
        names.add(act.__name__ if inspect.isroutine(act) else type(act).__name__)
    return names


def test_discovery_finds_the_families():
    assert not IMPORT_ERRORS, IMPORT_ERRORS
    assert len(CLASSES) >= MIN_CLASSES, sorted(CLASSES)
    assert set(EXPECTED_ACTIVATION) <= set(CLASSES), set(EXPECTED_ACTIVATION) - set(CLASSES)
    assert set(CONFIG_CLASS) | set(CONFIG_FIELDS) | set(INIT_KWARGS) | EAGER_FP32 <= set(CLASSES)
    assert set(SKIPS) <= set(CASES) and {v for vs in XFAILS.values() for v in vs} <= set(CASES)


@pytest.mark.parametrize("case", _params("test_the_plan_is_taken_or_the_fallback_names_its_cause"))
def test_the_plan_is_taken_or_the_fallback_names_its_cause(case):
    m = build(case)
    plan = gt.plan_for(m)
    key = VARIANTS.get(case, (case,))[0]
    if key in EXPECTED_ACTIVATION:
        assert plan.reason is None, plan.reason
        assert plan.activation == EXPECTED_ACTIVATION[key]
    if plan.reason is None:
        assert plan.verified
        assert _weights_shape_ok(m, plan.hidden) and plan.ffn == FFN
        assert plan.has_gate == m.has_gate and plan.has_bias == m.has_bias
        assert plan.transposed == m.is_transposed
    else:
        assert isinstance(plan.reason, str) and plan.reason.strip()
        assert any(name in plan.reason for name in _causes(m)), (plan.reason, _causes(m))


@pytest.mark.parametrize("case", _params("test_output_matches_the_eager_experts"))
def test_output_matches_the_eager_experts(case, caplog, monkeypatch):
    m = build(case)
    plan = gt.plan_for(m)
    if plan.reason is None:
        # gmjit's path in float64, its math done by the reference: equal to eager up to rounding,
        # and to the interface's batched_mm (same _apply_gate, biases, layout) in float64.
        from transformers.integrations.moe import batched_mm_experts_forward

        m = m.double()
        x, idx, w = _inputs(m, torch.float64)
        ours = gt.experts_forward(m, plan, x, idx, w, mlp=_reference_mlp)
        theirs = m(x, idx, w)
        if VARIANTS.get(case, (case,))[0] in EAGER_FP32:
            scale = theirs.abs().max().item()
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5 * scale)
        else:
            torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(ours, batched_mm_experts_forward(m, x, idx, w), rtol=1e-10,
                                   atol=1e-10)  # fmt: skip
        return
    # The fallback, through the registered entry point (transformers' grouped_mm has no float64
    # CPU kernel: float32 here), with its one warning naming the reason.
    monkeypatch.setattr(gt, "_warned", set())
    m = m.float()
    x, idx, w = _inputs(m, torch.float32)
    theirs = m(x, idx, w)
    m.config._experts_implementation = "gmjit"
    with caplog.at_level(logging.WARNING, logger="gmjit.transformers"):
        ours = m(x, idx, w)
    # The plan follows the cast: the reason is now the float32 weights' (or still its own).
    reason = gt.plan_for(m).reason
    assert reason is not None
    assert any(reason in r.getMessage() for r in caplog.records)
    scale = theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5 * scale)
