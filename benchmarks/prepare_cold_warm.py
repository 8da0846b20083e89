#!/usr/bin/env python3
"""Cold and warm start of gmjit.torch.prepare on a whole transformers MoE model, no GPU needed.

The model is built on the meta device from its config (no weights), its experts set to gmjit, in
training mode; `prepare` then compiles what a training step with activation recompute runs. Each
of the two runs is a fresh process on one cache folder: "cold" starts from an empty folder and
compiles with NVRTC, "warm" is a restarted job that finds every kernel on disk (each checked: a
run that compiled or read otherwise fails). NVRTC seconds are CPU time summed over the kernels.

    python3 benchmarks/prepare_cold_warm.py [--model qwen3-30b-a3b|gpt-oss|mixtral|tiny]
                                            [--arch sm_90a] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# Published configs (the MoE parts: hidden, expert ffn, experts, top-k, layers); attention sizes
# only need to be valid, since prepare looks at the experts alone.
MODELS = {
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(hidden_size=2048, moe_intermediate_size=768,
                                             num_experts=128, num_experts_per_tok=8,
                                             num_hidden_layers=48, num_attention_heads=32,
                                             num_key_value_heads=4, head_dim=128,
                                             intermediate_size=6144, vocab_size=151936)),
    "gpt-oss": ("GptOssConfig", dict(hidden_size=2880, intermediate_size=2880,
                                     num_local_experts=128, num_experts_per_tok=4,
                                     num_hidden_layers=36, num_attention_heads=64,
                                     num_key_value_heads=8, head_dim=64)),
    "mixtral": ("MixtralConfig", dict(hidden_size=4096, intermediate_size=14336,
                                      num_local_experts=8, num_experts_per_tok=2,
                                      num_hidden_layers=32, num_attention_heads=32,
                                      num_key_value_heads=8)),
    "tiny": ("Qwen3MoeConfig", dict(hidden_size=128, moe_intermediate_size=64, num_experts=4,
                                    num_experts_per_tok=2, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    intermediate_size=256, vocab_size=256)),
}  # fmt: skip


def run_once(model: str, arch: str) -> dict:
    """In this process: build the model on meta and prepare it; the report as a dict."""
    import torch
    import transformers

    import gmjit.torch
    import gmjit.transformers  # noqa: F401  (registers the gmjit experts implementations)

    config_class, fields = MODELS[model]
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="gmjit",
                                                          dtype=torch.bfloat16)  # fmt: skip
    m.train()
    start = time.perf_counter()
    report = gmjit.torch.prepare(m, arch=arch)
    seconds = time.perf_counter() - start
    return dict(model=model, arch=arch, layer_shapes=len(report.calls), kernels=report.kernels,
                kernels_compiled=report.kernels_compiled, disk_reads=report.disk_reads,
                nvrtc_seconds=round(report.nvrtc_seconds, 3), seconds=round(seconds, 3))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen3-30b-a3b")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--json", help="write both runs there")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one timed run
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_once(a.model, a.arch)))
        return
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        ap.error(f"--json {a.json}: its folder does not exist")  # before minutes of compiling
    rows = []
    with tempfile.TemporaryDirectory(prefix="gmjit-prepare-") as cache:
        # Only this folder serves the runs: no shared layer, no read-only or disabled cache, and
        # no NVRTC compile cache of the driver's (on a GPU machine it would make "cold" warm).
        env = {k: v for k, v in os.environ.items()
               if k not in ("GMJIT_CACHE_SHARED_DIR", "GMJIT_CACHE_READONLY",
                            "GMJIT_CACHE_DISABLE")}  # fmt: skip
        env.update(GMJIT_CACHE_DIR=cache, CUDA_CACHE_DISABLE="1")
        for phase in ("cold", "warm"):
            done = subprocess.run([sys.executable, __file__, "--child", "--model", a.model,
                                   "--arch", a.arch], env=env, capture_output=True,
                                  text=True)  # fmt: skip
            if done.returncode != 0:
                sys.exit(f"prepare_cold_warm: the {phase} run failed:\n{done.stderr.strip()}")
            rows.append(dict(phase=phase, **json.loads(done.stdout.strip().splitlines()[-1])))
    cold, warm = rows
    # A run that timed the wrong thing fails rather than reports it.
    if cold["kernels_compiled"] == 0 or cold["disk_reads"] != 0:
        sys.exit(f"prepare_cold_warm: the cold run compiled {cold['kernels_compiled']} kernels and "
                 f"read {cold['disk_reads']} from disk; expected compiles only")  # fmt: skip
    if warm["kernels_compiled"] != 0 or warm["disk_reads"] == 0:
        sys.exit(f"prepare_cold_warm: the warm run compiled {warm['kernels_compiled']} kernels and "
                 f"read {warm['disk_reads']} from disk; expected disk reads only (is the cache "
                 "folder writable?)")  # fmt: skip
    for r in rows:
        print(f"{r['phase']:5s} {r['model']}: {r['layer_shapes']} layer shape(s), {r['kernels']} "
              f"kernels, {r['kernels_compiled']} compiled ({r['nvrtc_seconds']} s NVRTC), "
              f"{r['disk_reads']} from disk, prepare {r['seconds']} s")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
