"""The package imports and answers without a GPU."""

from __future__ import annotations

import os
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


def test_the_packages_own_library_loads_whatever_ld_library_path_says(tmp_path):
    """Another libgmjit.so (a C++ install, an older build) on LD_LIBRARY_PATH is not loaded in
    place of the one beside _C, whose internal classes the extension calls."""
    import shutil
    import subprocess
    import sys

    own = pathlib.Path(gmjit.__file__).parent / "libgmjit.so"
    shutil.copy(own, tmp_path / "libgmjit.so")  # a decoy: same file, other folder
    code = ("import gmjit; print([l.split()[-1] for l in open('/proc/self/maps') "
            "if l.rstrip().endswith('libgmjit.so')][0])")  # fmt: skip
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert pathlib.Path(done.stdout.strip()).resolve() == own.resolve()


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
    fake = [(i + 1) << 40 for i in range(5)]  # aligned, 1 TiB apart (no overlap), never read
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
    fake = [(i + 1) << 40 for i in range(7)]  # aligned, 1 TiB apart (no overlap), never read
    with pytest.raises(gmjit.Error, match="no_device"):
        gmjit._C.forward_fp8(layer, 1, 16, 0, *fake[:6], 0, 0, 0, fake[6], 0, 0)
    with pytest.raises(gmjit.Error, match="no_device"):
        gmjit._C.quantize_weights(layer, 2, 0, *fake[:6], 0)
    with pytest.raises(ValueError, match="'recipe': is BF16"):
        gmjit._C.quantize_weights(layer, 0, 0, *fake[:6], 0)
    # The transposed copies (FP8 data gradients): four more addresses, by keyword or position.
    transposed = [(i + 8) << 40 for i in range(4)]
    with pytest.raises(gmjit.Error, match="no_device"):
        gmjit._C.quantize_weights(layer, 1, 0, *fake[:6], 0, *transposed)
    with pytest.raises(gmjit.Error, match="no_device"):
        gmjit._C.quantize_weights(layer, 3, 0, *fake[:6], 0, w1t_fp8=transposed[0],
                                  w1t_scales=transposed[1], w2t_fp8=transposed[2],
                                  w2t_scales=transposed[3])  # fmt: skip
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


def test_backward_binding_passes_the_transposed_fp8_weights_to_the_engine():
    # Rejected by the engine's validation, before anything runs (so safe with a GPU too).
    layer = gmjit._C.Layer(2, 128, 128, 0, 0, 7.0, 1.702, False, False, False, True)
    a = [(i + 1) << 12 for i in range(11)]  # well-formed addresses never dereferenced
    # layer, tokens, device, dy, x, split_sizes, w1, w2, b2, probs, saved_preact, dx, dw1, db1,
    # dw2, db2, dprobs, accumulate, stream
    base = (layer, 16, 0, a[0], a[1], a[2], a[3], a[4], 0, 0, a[5], a[6], 0, 0, 0, 0, 0, False, 0)
    with pytest.raises(ValueError, match=r"w1t_fp8.*BF16 recipe"):
        gmjit._C.backward(*base, 0, False, a[7], a[8], a[9], a[10])
    with pytest.raises(ValueError, match=r"w2t_scales"):  # all four or none
        gmjit._C.backward(*base, recipe=1, w1t_fp8=a[7], w1t_scales=a[8], w2t_fp8=a[9])


def test_supported_arches_name_what_prepare_takes():
    arches = gmjit.supported_arches()
    assert "sm_90a" in arches and "sm_80" in arches and all(a.startswith("sm_") for a in arches)


def test_gmjit_log_set_after_import_counts(tmp_path):
    """The library reads GMJIT_LOG on first use, not when it loads (its other first-use state is
    made at load, for fork safety)."""
    import subprocess
    import sys

    code = ("import os, gmjit.torch; os.environ['GMJIT_LOG'] = 'info'; "
            "gmjit.torch.prepare_layer(2, 64, 40, arch='sm_90a')")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "GMJIT_LOG"}
    env["GMJIT_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "gmjit [info] compiled" in done.stderr


def test_the_wheel_carries_the_command_line_tool_as_python_m_gmjit_and_a_console_script():
    """pip users get `gmjit` (compile, cache export/import, doctor) as a CMake install does."""
    import shutil
    import subprocess
    import sys

    from gmjit import _cli

    if not _cli.executable().exists():
        pytest.skip("built without CLI11/nlohmann_json: the wheel has no command")
    run = subprocess.run([sys.executable, "-m", "gmjit", "doctor"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert "nvrtc:" in run.stdout, run.stdout + run.stderr
    script = pathlib.Path(sys.executable).parent / "gmjit"
    if script.exists() or shutil.which("gmjit"):  # installed console scripts (not a source tree)
        run = subprocess.run([str(script if script.exists() else "gmjit"), "--help"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert run.returncode == 0 and "compile" in run.stdout, run.stdout + run.stderr


def test_a_missing_command_line_tool_is_explained(monkeypatch, capsys, tmp_path):
    from gmjit import _cli

    monkeypatch.setattr(_cli, "executable", lambda: tmp_path / "bin" / "gmjit")
    with pytest.raises(SystemExit) as exit_info:
        _cli.main()
    assert exit_info.value.code == 2
    assert "no command-line tool" in capsys.readouterr().err
