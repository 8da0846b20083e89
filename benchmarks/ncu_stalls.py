#!/usr/bin/env python3
"""Where one kernel's warps wait: Nsight Compute's PC-sampling stall reasons, in total and per
SASS instruction, for a kernel of a `gmjit bench` run.

  python3 benchmarks/ncu_stalls.py --gmjit build-gpu/cli/gmjit --kernel fc2_dgrad e64
  python3 benchmarks/ncu_stalls.py --gmjit old/cli/gmjit --gmjit new/cli/gmjit \\
      --env GMJIT_CACHE_DIR=/tmp/a --env GMJIT_CACHE_DIR=/tmp/b --kernel fc2_dgrad e64
  python3 benchmarks/ncu_stalls.py --source-csv saved.csv   # a saved `--page source` CSV

Each binary's run goes under `ncu --set full` for one launch of the matching kernel (the first
skipped); the report's source page (SASS with per-instruction samples) is read back as CSV. The
summary gives each stall reason's share of all samples and the --top instructions with the most
samples: offset from the kernel's first instruction, SASS, share, and the reasons that make up
most of it. With two binaries (--gmjit twice; --env applies to the one it follows) the reason
table gets a column per binary. Why: a step's time says that a kernel got slower, ncu's
duration says by how much; this says which instructions wait and on what (long scoreboard at a
store's data register: the store path is full; at a barrier's try-wait: the ring is empty).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ab_bench import parse_case, parse_env

ALL_SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass
class Line:
    offset: int  # bytes from the kernel's first instruction
    sass: str
    samples: float
    reasons: dict[str, float]


@dataclass
class Stalls:
    total: float
    reasons: dict[str, float]  # reason -> samples, over all instructions
    lines: list[Line]


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def parse_source_csv(text: str) -> Stalls:
    """The stalls of ncu's `--page source --csv --print-source sass` output (other lines, such as
    ncu's own messages before the table, are skipped)."""
    rows = list(csv.reader(io.StringIO(text)))
    head_at = next((i for i, row in enumerate(rows) if "Source" in row and ALL_SAMPLES in row),
                   None)  # fmt: skip
    if head_at is None:
        raise ValueError(f"no source table with a '{ALL_SAMPLES}' column in ncu's output")
    head = rows[head_at]
    at = {name: i for i, name in enumerate(head)}
    reason_cols = {name[len("stall_"):]: i for name, i in at.items()
                   if name.startswith("stall_") and "(" not in name}  # fmt: skip
    body = [row for row in rows[head_at + 1:] if len(row) == len(head)]
    first = None
    lines, totals = [], dict.fromkeys(reason_cols, 0.0)
    for row in body:
        address = int(row[at["Address"]], 16) if "Address" in at else len(lines) * 16
        first = address if first is None else min(first, address)
        reasons = {name: number(row[i]) for name, i in reason_cols.items()}
        for name, value in reasons.items():
            totals[name] += value
        lines.append(Line(address, row[at["Source"]].strip(), number(row[at[ALL_SAMPLES]]),
                          reasons))  # fmt: skip
    for line in lines:
        line.offset -= first or 0
    return Stalls(sum(line.samples for line in lines), totals, lines)


def main_reasons(line: Line, share: float = 0.8) -> str:
    """The largest reasons that make up `share` of the line's samples, as 'name pct'."""
    parts, covered = [], 0.0
    for name, value in sorted(line.reasons.items(), key=lambda kv: -kv[1]):
        if value <= 0 or covered >= share * line.samples:
            break
        parts.append(f"{name} {100 * value / line.samples:.0f}%")
        covered += value
    return ", ".join(parts)


def report(labels: list[str], stalls: list[Stalls], top: int) -> str:
    out = []
    names = sorted({n for s in stalls for n, v in s.reasons.items() if v > 0},
                   key=lambda n: -max(s.reasons.get(n, 0) / max(s.total, 1) for s in stalls))
    out.append(f"{'stall reason (% of samples)':30}" + "".join(f"{lab[:14]:>15}" for lab in labels))
    for name in names:
        out.append(f"{name:30}" + "".join(
            f"{100 * s.reasons.get(name, 0) / max(s.total, 1):15.1f}" for s in stalls))
    out.append(f"{'samples':30}" + "".join(f"{s.total:15.0f}" for s in stalls))
    for label, s in zip(labels, stalls):
        out.append(f"\n{label}: the {top} instructions with the most samples")
        for line in sorted(s.lines, key=lambda ln: -ln.samples)[:top]:
            pct = 100 * line.samples / max(s.total, 1)
            out.append(f"{pct:5.1f}%  +{line.offset:#07x}  {line.sass[:60]:60}  {main_reasons(line)}")
    return "\n".join(out)


def profile(ncu: str, gmjit: str, env: dict[str, str], kernel: str, case: str,
            workdir: str) -> str:  # fmt: skip
    """ncu's source page (CSV) of one launch of `kernel` in `gmjit bench` on `case`
    ('preset[:--opt[=v]]...')."""
    parsed = parse_case(case)
    argv = ["bench", "--preset", parsed.preset, *parsed.options]
    report_path = os.path.join(workdir, "stalls")
    run = subprocess.run([ncu, "--set", "full", "--import-source", "no", "-k", f"regex:{kernel}",
                          "--launch-skip", "1", "--launch-count", "1", "-f", "-o", report_path,
                          gmjit, *argv, "--repeats", "2"],
                         env={**os.environ, **env}, capture_output=True, text=True)  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"ncu on {gmjit} failed ({run.returncode}):\n{run.stderr[-2000:]}")
    page = subprocess.run([ncu, "-i", report_path + ".ncu-rep", "--page", "source", "--csv",
                           "--print-source", "sass"], capture_output=True, text=True)  # fmt: skip
    if page.returncode != 0:
        raise RuntimeError(f"ncu -i {report_path}.ncu-rep failed:\n{page.stderr[-2000:]}")
    return page.stdout


def binaries_with_env(argv: list[str]) -> list[tuple[str, list[str]]]:
    """(--gmjit, its --env items) in command-line order: an --env applies to the --gmjit before
    it."""
    pairs: list[tuple[str, list[str]]] = []
    it = iter(argv)
    for arg in it:
        key, _, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if key in ("--gmjit", "--env"):
            value = inline or next(it, "")
            if key == "--gmjit":
                pairs.append((value, []))
            elif not pairs:
                raise SystemExit("--env must follow the --gmjit it applies to")
            else:
                pairs[-1][1].append(value)
    return pairs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gmjit", action="append", default=[], help="a gmjit binary (at most 2)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--kernel", default=None, help="regex of the kernel's name")
    ap.add_argument("--source-csv", action="append", default=[],
                    help="a saved source-page CSV instead of a run")
    ap.add_argument("--save-dir", default=None, help="keep each run's source-page CSV here")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("case", nargs="?", help="preset[:--option[=value]]...")
    args = ap.parse_args(argv)
    runs = binaries_with_env(argv)
    if not runs and not args.source_csv:
        ap.error("give --gmjit (with --kernel and a case) or --source-csv")
    if runs and (args.kernel is None or args.case is None):
        ap.error("--gmjit needs --kernel and a case")
    if len(runs) + len(args.source_csv) > 2:
        ap.error("at most two variants")
    labels, pages = [], []
    for path in args.source_csv:
        with open(path, encoding="utf-8") as f:
            labels.append(os.path.basename(path))
            pages.append(f.read())
    for i, (binary, env_items) in enumerate(runs):
        env = parse_env(env_items, "--env")
        with tempfile.TemporaryDirectory() as workdir:
            pages.append(profile(args.ncu, binary, env, args.kernel, args.case, workdir))
        labels.append(f"{'AB'[i]}: {os.path.basename(os.path.dirname(os.path.dirname(binary)))}")
        if args.save_dir:
            os.makedirs(args.save_dir, exist_ok=True)
            with open(os.path.join(args.save_dir, f"source-{'AB'[i]}.csv"), "w") as f:
                f.write(pages[-1])
    print(report(labels, [parse_source_csv(page) for page in pages], args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
