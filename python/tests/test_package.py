"""The package imports and answers without a GPU."""

from __future__ import annotations

import pathlib

import pytest

import gmjit


def test_import_works_without_a_gpu_and_exposes_the_version():
    assert gmjit.__version__
    assert isinstance(gmjit.driver_available(), bool)


def test_counters_are_a_dict_of_the_engine_counters():
    c = gmjit.counters()
    for key in ("plans_built", "forward_plans_built", "backward_plans_built", "kernels_compiled",
                "disk_reads", "disk_shared_reads", "disk_writes", "memory_hits", "workspace_bytes"):  # fmt: skip
        assert isinstance(c[key], int), key
    assert isinstance(c["nvrtc_seconds"], float)


def test_library_and_extension_sit_together_in_the_package():
    folder = pathlib.Path(gmjit.__file__).parent
    assert (folder / "libgmjit.so").exists()
    assert any(p.name.startswith("_C.") for p in folder.iterdir())


def test_cache_directory_follows_the_environment(monkeypatch):
    import os

    assert gmjit.cache_directory().startswith(os.environ["GMJIT_CACHE_DIR"])


def test_nvrtc_version_is_major_dot_minor():
    major, minor = gmjit.nvrtc_version().split(".")
    assert int(major) >= 12 and int(minor) >= 0


def test_layer_rejects_an_unknown_activation_code_as_value_error():
    with pytest.raises(ValueError, match="activation"):
        gmjit._C.Layer(4, 256, 128, 99, 0, 7.0, 1.702, False, False, False, True)


def test_engine_errors_other_than_arguments_are_gmjit_errors():
    assert issubclass(gmjit.Error, RuntimeError)
    if gmjit.driver_available():
        pytest.skip("a driver is present")
    assert gmjit.devices() == []
    layer = gmjit._C.Layer(4, 256, 128, 0, 0, 7.0, 1.702, False, False, False, True)
    fake = [(i + 1) << 12 for i in range(5)]  # well-formed addresses never dereferenced
    with pytest.raises(gmjit.Error, match="no_device"):
        gmjit._C.forward(layer, 16, 0, fake[0], fake[1], fake[2], 0, fake[3], 0, 0, fake[4], 0, 0)


def test_prepare_compiles_a_forward_plan_without_a_gpu():
    # NVRTC runs on the CPU: this proves the wheel's libgmjit finds libnvrtc and its templates.
    layer = gmjit._C.Layer(2, 64, 64, 0, 0, 7.0, 1.702, False, False, False, True)
    before = gmjit.counters()
    names = gmjit._C.prepare(layer, False, "sm_80")
    after = gmjit.counters()
    assert names
    assert after["kernels_compiled"] + after["disk_reads"] > before["kernels_compiled"] + before["disk_reads"]
    again = gmjit._C.prepare(layer, False, "sm_80")
    assert again == names
    assert gmjit.counters()["kernels_compiled"] == after["kernels_compiled"]


def test_fp8_entry_points_check_the_recipe_then_need_a_device():
    if gmjit.driver_available():
        pytest.skip("a driver is present")
    layer = gmjit._C.Layer(2, 128, 128, 0, 0, 7.0, 1.702, False, False, False, True)
    fake = [(i + 1) << 12 for i in range(7)]  # well-formed addresses never dereferenced
    with pytest.raises(gmjit.Error, match="no_device"):
        gmjit._C.forward_fp8(layer, 1, 16, 0, *fake[:6], 0, 0, 0, fake[6], 0, 0)
    with pytest.raises(gmjit.Error, match="no_device"):
        gmjit._C.quantize_weights(layer, 2, 0, *fake[:6], 0)
    with pytest.raises(ValueError, match="'recipe': is BF16"):
        gmjit._C.quantize_weights(layer, 0, 0, *fake[:6], 0)
    with pytest.raises(ValueError, match="'recipe': 7 is not a recipe code"):
        gmjit._C.forward_fp8(layer, 7, 16, 0, *fake[:6], 0, 0, 0, fake[6], 0, 0)


def test_prepare_compiles_the_fp8_forward_plans_without_a_gpu():
    layer = gmjit._C.Layer(2, 128, 128, 0, 0, 7.0, 1.702, False, False, False, True)
    names = gmjit._C.prepare(layer, True, "sm_90a", 1)
    assert any("quantize_x" in n for n in names) and all("fp8" in n for n in names)
    pow2 = gmjit._C.prepare(layer, False, "sm_90a", 2)
    assert pow2 != names and all("p2" in n for n in pow2)
    with pytest.raises(gmjit.Error, match="sm_90a"):  # FP8 runs on Hopper only
        gmjit._C.prepare(layer, False, "sm_80", 1)
