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
