"""examples/train_moe.py with both recipes: the FP8 block recipe trains the same toy model from
the same seed, and its loss tracks the BF16 one."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

pytestmark = pytest.mark.gpu

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_moe.py"


def load_example():
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("train_moe_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fp8_block_loss_tracks_bf16_from_the_same_seed():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 recipes run on Hopper (sm_90a) only")
    example = load_example()
    # The example's model (hidden 512, ffn 512: whole 128-wide scale blocks), fewer tokens.
    a = example.parse_args(["--steps", "40", "--batch", "8", "--seq", "128", "--layers", "2"])
    bf16 = example.train(example.gmjit_impl("bf16"), a)["losses"]
    fp8 = example.train(example.gmjit_impl("fp8_block"), a)["losses"]
    assert all(torch.isfinite(torch.tensor(fp8)))
    # Same initial model and data: step 0 differs by the forward's quantization noise only.
    assert abs(fp8[0] - bf16[0]) / bf16[0] < 0.02, (fp8[0], bf16[0])
    last_bf16 = sum(bf16[-5:]) / 5
    last_fp8 = sum(fp8[-5:]) / 5
    print(f"loss: start {bf16[0]:.4f} / {fp8[0]:.4f}, last 5 steps bf16 {last_bf16:.4f}, "
          f"fp8_block {last_fp8:.4f}")  # fmt: skip
    assert last_bf16 < 0.9 * bf16[0]  # it learned something
    assert abs(last_fp8 - last_bf16) / last_bf16 < 0.05


def test_after_prepare_the_training_loop_compiles_nothing():
    """--prepare: gmjit.torch.prepare(model) on the example's model (gradient checkpointing, every
    experts module) leaves the loop nothing to compile or read from disk. Widths no other test
    uses, so that the kernels are new to this process."""
    example = load_example()
    a = example.parse_args(["--steps", "3", "--batch", "2", "--seq", "64", "--layers", "2",
                            "--hidden", "320", "--ffn", "224", "--prepare"])  # fmt: skip
    result = example.train(example.gmjit_impl("bf16"), a)
    assert result["prepared"]["kernels"] > 0
    assert result["loop_compiles"] == 0 and result["loop_disk_reads"] == 0, result
    assert all(torch.isfinite(torch.tensor(result["losses"])))
