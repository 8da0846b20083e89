#!/usr/bin/env python3
"""A/B timing of two gmjit builds (or one build under two environments) in one GPU session.

Numbers from different machines, or from one machine minutes apart, differ by a few percent
(docs/PERFORMANCE.md, session 9), more than most kernel changes gain. So both variants run in
the same call, alternately (A B A B ...), each case `--rounds` times per variant, and the table
compares the best round of each:

  python3 benchmarks/ab_bench.py --a build-old/cli/gmjit --b build-gpu/cli/gmjit \\
      mixtral deepseek:--ragged qwen3-30b-a3b:--tokens-per-expert=16
  python3 benchmarks/ab_bench.py --a build-gpu/cli/gmjit --a-env GMJIT_STATIC_TILES=1 \\
      --b build-gpu/cli/gmjit gpt-oss:--ragged

A case is a preset, then `gmjit bench` options after colons (`=` joins an option to its value).
Each run is `gmjit bench --preset P OPTIONS --repeats N`; its "forward" and "fwd+bwd" lines give
the milliseconds. With `--python`, the variants are two builds of the torch package instead,
each a folder put first on PYTHONPATH (`pip install --target DIR`; `-` for the installed one),
a case is a side_by_side.py shape with layer_step.py's options (`e64:--ragged`), and each run is
`layer_step.py SHAPE OPTIONS --time --iters N`: the path the targets table times (bf16 weight
gradients), where `gmjit bench` writes fp32 ones unless a case adds `--bf16-weight-grads`.

  python3 benchmarks/ab_bench.py --python --a /tmp/old-site --b - deepseek e64:--ragged

`--ncu REGEX` compares kernels instead of steps: each run goes under Nsight Compute (clocks
left free, the first matching launch skipped, the next `--ncu-launches` measured), and the table
gives, per case and matching kernel, the median duration, tensor-pipe activity and DRAM bytes of
each variant. A step's time is the wrong measure for a change to one kernel when the GPU runs at
its power cap: a variant that writes less (or writes zeros) lets the kernels after it run cooler,
hence faster, and the step gains what the changed kernel did not (docs/PERFORMANCE.md, session 28).

  python3 benchmarks/ab_bench.py --a old/cli/gmjit --b new/cli/gmjit --ncu fc2_dgrad e64 mixtral

`--stop-after-s` skips the cases that would start after that many seconds (a device call has a
time limit), `--json` keeps every round. A case that fails (a bench error, an `--ncu` regex that
matches none of its kernels, a missing binary) is reported with its error and the run goes on
with the others: the table shows what ran, the JSON lists the failures, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

LINE = re.compile(r"^\s*(forward|fwd\+bwd)\s+([0-9.]+) ms")


# Per-kernel metrics of --ncu runs: duration (ns), tensor-pipe activity (%), DRAM bytes.
NCU_METRICS = {
    "gpu__time_duration.sum": "ns",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pct",
    "dram__bytes_read.sum": "dram_read",
    "dram__bytes_write.sum": "dram_write",
}

LAYER_STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layer_step.py")


@dataclass
class Variant:
    name: str
    binary: str  # a gmjit binary, or with --python a PYTHONPATH folder ("-": none)
    env: dict[str, str]
    python: bool = False

    def command(self, case: Case, repeats: int) -> tuple[list[str], dict[str, str]]:
        """The run's argv and environment."""
        env = {**os.environ, **self.env}
        if not self.python:
            return [self.binary, "bench", "--preset", case.preset, *case.options, "--repeats",
                    str(repeats)], env  # fmt: skip
        if self.binary != "-":
            env["PYTHONPATH"] = os.pathsep.join(p for p in (self.binary, env.get("PYTHONPATH"))
                                                if p)  # fmt: skip
        return [sys.executable, LAYER_STEP, case.preset, *case.options, "--time", "--iters",
                str(repeats)], env  # fmt: skip


@dataclass
class Ncu:
    """How --ncu runs wrap a variant's command."""
    regex: str
    launches: int
    binary: str = "ncu"

    def wrap(self, argv: list[str]) -> list[str]:
        return [self.binary, "--clock-control", "none", "--print-units", "base", "-k",
                f"regex:{self.regex}", "--launch-skip", "1", "--launch-count", str(self.launches),
                "--metrics", ",".join(NCU_METRICS), "--csv", *argv]  # fmt: skip


@dataclass
class Case:
    label: str
    preset: str
    options: list[str]
    # Per variant, a run per round: (forward ms, fwd+bwd ms), or with --ncu kernels_of's dict.
    rounds: dict[str, list] = field(default_factory=dict)


def parse_case(text: str) -> Case:
    preset, *options = text.split(":")
    if not preset:
        raise argparse.ArgumentTypeError(f"case '{text}': expected a preset before any ':'")
    argv = [part for option in options for part in option.split("=", 1)]
    return Case(text, preset, argv)


def parse_env(items: list[str], flag: str) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"{flag} '{item}': expected NAME=VALUE")
        env[name] = value
    return env


def times_of(output: str) -> tuple[float, float]:
    """(forward ms, fwd+bwd ms) from a `gmjit bench` report."""
    found = {}
    for line in output.splitlines():
        m = LINE.match(line)
        if m and m.group(1) not in found:
            found[m.group(1)] = float(m.group(2))
    if set(found) != {"forward", "fwd+bwd"}:
        tail = "\n".join(output.splitlines()[-15:])
        raise RuntimeError(f"no forward and fwd+bwd lines in the report:\n{tail}")
    return found["forward"], found["fwd+bwd"]


def kernels_of(output: str) -> dict[str, list[dict[str, float]]]:
    """Per kernel name, its launches' metrics (NCU_METRICS' short names), from ncu's --csv
    output mixed with the profiled program's own."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"')), None)
    if start is None:
        raise RuntimeError("no ncu CSV header in the output:\n" + "\n".join(lines[-15:]))
    rows = csv.reader(line for line in lines[start:] if line.startswith('"'))
    head = next(rows)
    col = {name: head.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    launches: dict[str, dict[str, float]] = {}
    names: dict[str, str] = {}
    for row in rows:
        metric = NCU_METRICS.get(row[col["Metric Name"]])
        if metric is None:
            continue
        launch = row[col["ID"]]
        names[launch] = row[col["Kernel Name"]]
        value = float(row[col["Metric Value"]].replace(",", ""))
        launches.setdefault(launch, {})[metric] = value
    found: dict[str, list[dict[str, float]]] = {}
    for launch, metrics in launches.items():
        found.setdefault(names[launch], []).append(metrics)
    if not found:
        raise RuntimeError("ncu profiled no kernel: does the --ncu regex match one?")
    return found


def run_once(variant: Variant, case: Case, repeats: int, ncu: Ncu | None = None):
    """(forward ms, fwd+bwd ms), or with ncu the profiled kernels' metrics (kernels_of)."""
    argv, env = variant.command(case, repeats)
    if ncu is not None:
        argv = ncu.wrap(argv)
    run = subprocess.run(argv, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({run.returncode}):\n{run.stderr[-2000:]}")
    return kernels_of(run.stdout) if ncu is not None else times_of(run.stdout)


def table(cases: list[Case], a: Variant, b: Variant) -> str:
    head = ["A fwd", "B fwd", "A/B", "A f+b", "B f+b", "A/B"]
    rows = [f"{'case':34} " + " ".join(f"{h:>9}" if "/" not in h else f"{h:>6}" for h in head)]
    for c in cases:
        if not c.rounds.get(a.name) or not c.rounds.get(b.name):
            continue
        fa = min(r[0] for r in c.rounds[a.name])
        fb = min(r[0] for r in c.rounds[b.name])
        ba = min(r[1] for r in c.rounds[a.name])
        bb = min(r[1] for r in c.rounds[b.name])
        rows.append(f"{c.label:34} {fa:9.3f} {fb:9.3f} {fa / fb:6.3f} {ba:9.3f} {bb:9.3f} "
                    f"{ba / bb:6.3f}")  # fmt: skip
    rows.append("(ms, best of each variant's rounds; A/B > 1: B is faster)")
    return "\n".join(rows)


def kernel_table(cases: list[Case], a: Variant, b: Variant) -> str:
    """Per case and kernel: median duration (µs), tensor-pipe activity and DRAM traffic (GB read
    + written) of each variant over all its rounds' launches."""
    def median(runs, kernel: str, metric: str) -> float:
        values = [m.get(metric, 0.0) for run in runs for m in run.get(kernel, [])]
        return statistics.median(values) if values else float("nan")

    head = f"{'case / kernel':58} {'A us':>9} {'B us':>9} {'A/B':>6} {'A tc%':>6} {'B tc%':>6} " \
           f"{'A GB':>6} {'B GB':>6}"  # fmt: skip
    rows = [head]
    for c in cases:
        ra, rb = c.rounds.get(a.name, []), c.rounds.get(b.name, [])
        kernels = list(dict.fromkeys(k for run in ra + rb for k in run))
        for k in kernels:
            ta, tb = median(ra, k, "ns") / 1e3, median(rb, k, "ns") / 1e3
            gb_a = (median(ra, k, "dram_read") + median(ra, k, "dram_write")) / 1e9
            gb_b = (median(rb, k, "dram_read") + median(rb, k, "dram_write")) / 1e9
            label = f"{c.label} {k}"[:58]
            rows.append(f"{label:58} {ta:9.1f} {tb:9.1f} {ta / tb:6.3f} "
                        f"{median(ra, k, 'tensor_pct'):6.1f} {median(rb, k, 'tensor_pct'):6.1f} "
                        f"{gb_a:6.2f} {gb_b:6.2f}")  # fmt: skip
    rows.append("(median of every launch of each variant; A/B > 1: B is faster; tc%: tensor-pipe "
                "activity; GB: DRAM read + written)")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", type=parse_case, help="preset[:option[=value]]...")
    ap.add_argument("--a", required=True, help="gmjit binary of variant A (--python: a folder)")
    ap.add_argument("--b", required=True, help="gmjit binary of variant B (--python: a folder)")
    ap.add_argument("--python", action="store_true",
                    help="compare two builds of the torch package through layer_step.py")
    ap.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--rounds", type=int, default=2, help="runs per variant and case")
    ap.add_argument("--repeats", type=int, default=20,
                    help="gmjit bench --repeats (--python: layer_step.py --iters)")
    ap.add_argument("--ncu", metavar="REGEX", default=None,
                    help="compare the kernels whose names match, under Nsight Compute")
    ap.add_argument("--ncu-launches", type=int, default=4,
                    help="matching launches measured per run (after the first, skipped)")
    ap.add_argument("--ncu-binary", default="ncu")
    ap.add_argument("--stop-after-s", type=float, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or args.ncu_launches < 1:
        ap.error("--rounds, --repeats and --ncu-launches must be at least 1")
    ncu = Ncu(args.ncu, args.ncu_launches, args.ncu_binary) if args.ncu else None
    a = Variant("A", args.a, parse_env(args.a_env, "--a-env"), args.python)
    b = Variant("B", args.b, parse_env(args.b_env, "--b-env"), args.python)
    start = time.monotonic()
    done: list[Case] = []
    failed: list[tuple[str, str]] = []  # (case, error)
    for case in args.cases:
        if args.stop_after_s is not None and time.monotonic() - start > args.stop_after_s:
            print(f"skipped {case.label}: past --stop-after-s", file=sys.stderr)
            continue
        try:
            for _ in range(args.rounds):
                for v in (a, b):
                    case.rounds.setdefault(v.name, []).append(
                        run_once(v, case, args.repeats, ncu))
        except (RuntimeError, OSError) as e:
            # One case's failure costs that case only: a device call's time is too scarce to
            # lose the cases that ran before it.
            print(f"failed {case.label}: {e}", file=sys.stderr)
            failed.append((case.label, str(e)))
            continue
        done.append(case)
    print(kernel_table(done, a, b) if ncu else table(done, a, b))
    for label, error in failed:
        print(f"FAILED {label}: {error.strip().splitlines()[0] if error.strip() else '?'}")
    if args.json:
        record = {"a": vars(a), "b": vars(b), "repeats": args.repeats, "ncu": args.ncu,
                  "cases": [{"case": c.label, "rounds": c.rounds} for c in done],
                  "failed": [{"case": c, "error": e} for c, e in failed]}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
