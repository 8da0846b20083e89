"""benchmarks/side_by_side.py --reference-json: torch's numbers per shape in the form that
`gmjit bench --reference` reads (benchmarks/harness.cpp add_reference)."""

from __future__ import annotations

from benchmark_scripts import load


def _side_by_side():
    return load("side_by_side")


def test_reference_records_hold_eager_and_compiled_tflops_per_shape_and_skip_decode_rows():
    sbs = _side_by_side()
    base = {"experts": 8, "tokens": 32768, "hidden": 4096, "ffn": 14336, "activation": "swiglu"}
    rows = [
        {**base, "base_shape": "mixtral", "ragged": False, "decode": False,
         "torch": {"forward_tflops": 550.0, "fwd_bwd_tflops": 507.0},
         "compile": {"forward_tflops": 649.0, "fwd_bwd_tflops": 604.0},
         "gmjit": {"forward_tflops": 680.0}},
        {**base, "base_shape": "mixtral", "ragged": True, "decode": False,
         "torch": {"forward_tflops": 500.0, "fwd_bwd_error": "out of memory"}},
        {**base, "base_shape": "mixtral", "ragged": False, "decode": True,
         "torch": {"forward_tflops": 1.0}},
    ]  # fmt: skip
    meta = {"torch": "2.11.0", "gpu": "NVIDIA H200"}
    balanced, ragged = sbs.reference_records(rows, meta)
    assert balanced == {**base, "shape": "mixtral", "ragged": False, "torch": "2.11.0",
                        "gpu": "NVIDIA H200", "forward_tflops": 550.0, "fwd_bwd_tflops": 507.0,
                        "forward_compiled_tflops": 649.0, "fwd_bwd_compiled_tflops": 604.0}  # fmt: skip
    assert ragged["ragged"] is True and ragged["forward_tflops"] == 500.0
    assert "fwd_bwd_tflops" not in ragged and "forward_compiled_tflops" not in ragged


def test_extra_shape_specs_parse_and_malformed_ones_exit_with_the_reason():
    import pytest

    sbs = _side_by_side()
    s = sbs.parse_shape("odd=64,512,2000,1000")
    assert (s.name, s.experts, s.tokens_per_expert, s.hidden, s.ffn) == ("odd", 64, 512, 2000, 1000)
    assert s.activation == "swiglu" and not s.biases and s.probs
    g = sbs.parse_shape("oss=32,256,1440,1440,clamped_swiglu,bias")
    assert g.activation == "clamped_swiglu" and g.biases
    for bad, reason in [("x=1,2,3", "expected"), ("x=8,0,64,64", "positive"),
                        ("x=8,8,64,64,tanh", "activation"), ("x=8,8,64,64,relu,b", "sixth"),
                        ("=8,8,64,64", "expected"), ("x=8,8,a,64", "invalid literal")]:  # fmt: skip
        with pytest.raises(SystemExit, match=reason):
            sbs.parse_shape(bad)


def test_decode_targets_judge_rows_of_at_most_16_tokens_per_expert_only():
    import types

    sbs = _side_by_side()
    rows = [
        {"shape": f"deepseek-decode{t}", "base_shape": "deepseek", "decode": True,
         "tokens_per_expert": t, "weight_bytes": 11274.3e6, "forward_vs_torch": vs_eager,
         "gmjit": {"forward_ms": ms, "forward_gbs": 11274.3 / ms, "forward_hbm_pct": pct}}
        for t, ms, pct, vs_eager in ((16, 2.51, 93.6, 1.39), (128, 3.174, 74.0, 1.19))
    ]  # fmt: skip
    meta = {"torch": "2.11.0", "gpu": "NVIDIA H200", "reps": 10, "warmup": 3, "decode_reps": 30}
    got = sbs.summarize(rows, types.SimpleNamespace(hbm_peak_gbs=4800.0), meta)
    assert (got["met"], got["cells"]) == (1, 2)  # the 16-token row's two cells only
    judged, reported = got["decode"]
    assert judged["hbm_meets"] is True and judged["vs_eager_meets"] is False
    assert reported["hbm_meets"] is None and reported["vs_eager_meets"] is None
    md = got["markdown"].splitlines()
    row16 = next(line for line in md if line.startswith("| deepseek | 16 |"))
    row128 = next(line for line in md if line.startswith("| deepseek | 128 |"))
    assert "93.6 % ✓" in row16 and "1.39× ✗" in row16
    assert "74.0 %" in row128 and "✓" not in row128 and "✗" not in row128
