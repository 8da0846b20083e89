#!/usr/bin/env python3
"""Timing-only ablations of the kernel templates: which part of a kernel costs what.

Each variant removes or replaces one part of a kernel (its loads, stores, math) in a copy of the
source tree, so that the copy's build, timed against the original's at kernel level, says what
that part costs:

  python3 benchmarks/template_ablation.py --list
  python3 benchmarks/template_ablation.py . /tmp/src-nostore fc2-dgrad-nostore
  (build /tmp/src-nostore, then)
  python3 benchmarks/ab_bench.py --a build/cli/gmjit --b /tmp/b-nostore/cli/gmjit \\
      --ncu fc2_dgrad mixtral e64

`.ci/gpu_ablation.sh` does all of it in one GPU call. The variants compute wrong results (a
removed store leaves its output unwritten): time them only at kernel level (`ab_bench.py
--ncu`), never by a training step's time, where the kernels after a variant read what it left
behind (zeros draw less power under the GPU's power cap, docs/PERFORMANCE.md, session 28).
Each edit names a unique piece of template text; the CPU tests check that every variant still
applies, so a template change that moves one fails there, not on the GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass

FC2_DGRAD = "sm90_mlp_bwd.cuh"


@dataclass(frozen=True)
class Edit:
    file: str  # under kernel_templates/
    old: str  # must occur exactly once
    new: str


@dataclass(frozen=True)
class Variant:
    what: str
    edits: tuple[Edit, ...]


VARIANTS: dict[str, Variant] = {
    # The FC2 dgrad variants edit both epilogues: the consumers' (immediate, K < 4096) and the
    # epilogue warps' units (deferred, K >= 4096; emit_row_segment is shared).
    "fc2-dgrad-noload": Variant(
        "FC2 dgrad reads the pre-activation of 8 rows only (L1-hot): the cost of its loads",
        (Edit(FC2_DGRAD, "const unsigned short* hr = pre + row * kF1;",
              "const unsigned short* hr = pre + (row & 7) * kF1;"),
         Edit(FC2_DGRAD, "static_cast<const unsigned short*>(p.plain.preact) + at.row * kF1;",
              "static_cast<const unsigned short*>(p.plain.preact) + (at.row & 7) * kF1;"))),  # fmt: skip
    "fc2-dgrad-nostore": Variant(
        "FC2 dgrad stores no dpreact and no a * p (a never-true predicate): the stores' cost",
        (Edit(FC2_DGRAD, "    if (store) {", "    if (store && pr == -1234.5f) {"),)),  # fmt: skip
    "fc2-dgrad-noepilogue": Variant(
        "FC2 dgrad returns before its epilogue (or, deferred, before each unit): the mainloop "
        "alone",
        (Edit(FC2_DGRAD,
              "    const unsigned short* pre = static_cast<const unsigned short*>(p.plain.preact);\n",
              "    if (rt.row_end >= 0) return;  // never false; the compiler cannot tell\n"
              "    const unsigned short* pre = static_cast<const unsigned short*>(p.plain.preact);\n"),
         Edit(FC2_DGRAD, "    // This lane's 16 values of g: its row,",
              "    if (t.rt.row_end >= 0) return 0.0f;  // never false; the compiler cannot tell\n"
              "    // This lane's 16 values of g: its row,"))),  # fmt: skip
    "fc2-dgrad-nomath": Variant(
        "FC2 dgrad's epilogue skips the activation and its gradient (g and the pre-activation "
        "pass straight to the outputs): the math's cost",
        (Edit(FC2_DGRAD,
              "      if constexpr (kGlu) {\n"
              "        r0 = glu_fwd_bwd<Cfg::act>(x0, bf16x2_lo(lw), g0 * pr, ap);\n"
              "        r1 = glu_fwd_bwd<Cfg::act>(x1, bf16x2_hi(lw), g1 * pr, ap);\n"
              "      } else {\n"
              "        r0 = act_fwd_bwd<Cfg::act>(x0, g0 * pr, ap);\n"
              "        r1 = act_fwd_bwd<Cfg::act>(x1, g1 * pr, ap);\n"
              "      }",
              "      r0 = {x0, g0, bf16x2_lo(lw)};\n"
              "      r1 = {x1, g1, bf16x2_hi(lw)};"),)),  # fmt: skip
    "sigmoid-one-mufu": Variant(
        "sigmoid from one tanh.approx instead of ex2 + rcp (every kernel evaluating SwiGLU): the "
        "special-function unit's share (less accurate: timing only)",
        (Edit("activations.cuh", "  return rcp_approx(1.0f + fast_exp(-x));",
              "  float t;\n  asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(t) : \"f\"(0.5f * x));\n"
              "  return fmaf(0.5f, t, 0.5f);"),)),  # fmt: skip
}


def apply(templates: str, name: str) -> None:
    """Applies variant `name`'s edits to the kernel_templates folder `templates`, in place."""
    variant = VARIANTS.get(name)
    if variant is None:
        raise SystemExit(f"unknown variant {name!r}: expected one of {', '.join(VARIANTS)}")
    for edit in variant.edits:
        path = os.path.join(templates, edit.file)
        with open(path) as f:
            text = f.read()
        found = text.count(edit.old)
        if found != 1:
            raise SystemExit(f"variant {name}: expected the edited text once in {edit.file}, "
                             f"found it {found} times: {edit.old.strip()[:80]!r}")  # fmt: skip
        with open(path, "w") as f:
            f.write(text.replace(edit.old, edit.new))


def copy_tree(src: str, dst: str) -> None:
    """The source tree without its build folders (build*/ at the top), VCS data, carried device
    files or Python caches."""
    top = os.path.abspath(src)

    def skip(folder: str, names: list[str]) -> set[str]:
        at_top = os.path.abspath(folder) == top
        return {n for n in names if n in (".git", ".devcarry", "__pycache__")
                or (at_top and n.startswith("build") and os.path.isdir(os.path.join(folder, n)))}

    shutil.copytree(src, dst, ignore=skip, dirs_exist_ok=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", help="source tree (the repository root)")
    ap.add_argument("dst", nargs="?", help="new folder for the ablated copy")
    ap.add_argument("variant", nargs="?", help="variant name (--list)")
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name, v in VARIANTS.items():
            print(f"{name:22} {v.what}")
        return 0
    if not (args.src and args.dst and args.variant):
        ap.error("expected SRC DST VARIANT (or --list)")
    if args.variant not in VARIANTS:
        ap.error(f"unknown variant {args.variant!r}: expected one of {', '.join(VARIANTS)}")
    copy_tree(args.src, args.dst)
    apply(os.path.join(args.dst, "kernel_templates"), args.variant)
    print(f"{args.dst}: {args.variant} ({VARIANTS[args.variant].what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
