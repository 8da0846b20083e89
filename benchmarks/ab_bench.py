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
gradients), where `gmjit bench` writes fp32 ones.

  python3 benchmarks/ab_bench.py --python --a /tmp/old-site --b - deepseek e64:--ragged

`--stop-after-s` skips the cases that would start after that many seconds (a device call has a
time limit), `--json` keeps every round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

LINE = re.compile(r"^\s*(forward|fwd\+bwd)\s+([0-9.]+) ms")


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
class Case:
    label: str
    preset: str
    options: list[str]
    rounds: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


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


def run_once(variant: Variant, case: Case, repeats: int) -> tuple[float, float]:
    argv, env = variant.command(case, repeats)
    run = subprocess.run(argv, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({run.returncode}):\n{run.stderr[-2000:]}")
    return times_of(run.stdout)


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
    ap.add_argument("--stop-after-s", type=float, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be at least 1")
    a = Variant("A", args.a, parse_env(args.a_env, "--a-env"), args.python)
    b = Variant("B", args.b, parse_env(args.b_env, "--b-env"), args.python)
    start = time.monotonic()
    done: list[Case] = []
    for case in args.cases:
        if args.stop_after_s is not None and time.monotonic() - start > args.stop_after_s:
            print(f"skipped {case.label}: past --stop-after-s", file=sys.stderr)
            continue
        for _ in range(args.rounds):
            for v in (a, b):
                case.rounds.setdefault(v.name, []).append(run_once(v, case, args.repeats))
        done.append(case)
    print(table(done, a, b))
    if args.json:
        record = {"a": vars(a), "b": vars(b), "repeats": args.repeats,
                  "cases": [{"case": c.label, "rounds": c.rounds} for c in done]}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
