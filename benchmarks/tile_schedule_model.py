#!/usr/bin/env python3
"""A model of the Hopper forward kernels' persistent tile schedule, on the CPU.

The sm90 grouped GEMMs (kernel_templates/sm90_grouped_gemm.cuh) run one CTA per SM. Until
session 9 CTA c took tiles c, c + #SMs, c + 2·#SMs, ... of a grouped order (they still do when
every tile is full; otherwise they claim tiles from a counter, the "dynamic" schedule below) (expert_schedule.cuh's tile_coords:
`group` row tiles walked before the next column tile), so that the tiles in flight at one time
share row tiles of A and column tiles of B in L2. That holds while every tile costs the same.
When some tiles cost less, the CTAs that draw them run ahead and the tiles in flight spread over
more of the order: more distinct A and B tiles at once, less reuse in L2.

This script replays the schedule with a cost per tile (1 for a tile of more than 64 rows,
--small-tile-cost for one of at most 64, e.g. 0.5 if its second consumer warpgroup skipped its
MMAs) and reports, sampled over the run: the spread of tile indices in flight and the bytes of
the distinct A row tiles and B column tiles they read (K = H for FC1, F for FC2), beside the
same for a dynamic schedule (each CTA takes the next tile in order when it finishes one). It is
a model, not a measurement: no memory system, only who works on what when.

  python3 benchmarks/tile_schedule_model.py --shape deepseek --ragged --small-tile-cost 0.5

Session 8 (docs/PERFORMANCE.md) uses it to explain why skipping the idle warpgroup's MMAs slowed
ragged prefill; session 9 built the dynamic schedule it compares against.
"""

from __future__ import annotations

import argparse
import heapq
from dataclasses import dataclass

from expert_loads import expert_tokens  # benchmarks/, next to this script

BLOCK_M = 128
GROUP_M = 8  # codegen/emit_common.cpp sm90_tile_dividing
GLU = ("swiglu", "geglu", "clamped_swiglu")


@dataclass(frozen=True)
class Layer:
    experts: int
    tokens_per_expert: int
    hidden: int
    ffn: int
    glu: bool


def row_tiles(split: list[int], block_m: int = BLOCK_M) -> list[tuple[int, int]]:
    """(expert, rows) of each row tile, experts in order (find_row_tile's enumeration; the
    splits sum to the tokens, so no tail tiles)."""
    tiles = []
    for expert, n in enumerate(split):
        full, rest = divmod(n, block_m)
        tiles += [(expert, block_m)] * full + ([(expert, rest)] if rest else [])
    return tiles


def tile_coords(t: int, num_m: int, num_n: int, group: int) -> tuple[int, int]:
    """expert_schedule.cuh's tile_coords."""
    per_group = group * num_n
    first_m = (t // per_group) * group
    size_m = min(group, num_m - first_m)
    in_group = t % per_group
    return first_m + in_group % size_m, in_group // size_m


def widest_tile(columns: int, b_rows_per_column: int) -> int:
    """block_n as codegen/emit_common.cpp's sm90_tile_dividing picks it (B rows per tile)."""
    for block_n in (256, 192, 128, 64):
        if block_n // b_rows_per_column % (64 if b_rows_per_column == 1 else 32):
            continue
        if columns % (block_n // b_rows_per_column) == 0:
            return block_n
    raise ValueError(f"no Hopper tile divides {columns} columns")


def schedule(costs: list[float], ctas: int, dynamic: bool) -> list[float]:
    """Start time of every tile: static round-robin (tile t on CTA t % ctas) or dynamic."""
    start = [0.0] * len(costs)
    if dynamic:
        free = [(0.0, c) for c in range(ctas)]
        for t, cost in enumerate(costs):
            at, c = heapq.heappop(free)
            start[t] = at
            heapq.heappush(free, (at + cost, c))
    else:
        clock = [0.0] * ctas
        for t, cost in enumerate(costs):
            start[t] = clock[t % ctas]
            clock[t % ctas] += cost
    return start


@dataclass
class Report:
    tiles: int
    small_tiles: int
    makespan: float
    mean_spread: float  # tile indices between the first and last tile in flight
    max_spread: int
    mean_working_set_mb: float  # bytes of distinct A row tiles + B column tiles in flight
    max_working_set_mb: float


def replay(layer: Layer, ragged: bool, fc: int, small_cost: float, ctas: int,
           dynamic: bool, samples: int = 200) -> Report:  # fmt: skip
    split = expert_tokens(layer.experts, layer.tokens_per_expert, ragged)
    rows = row_tiles(split)
    if fc == 1:
        k, columns, b_rows = layer.hidden, layer.ffn, 2 if layer.glu else 1
    else:
        k, columns, b_rows = layer.ffn, layer.hidden, 1
    block_n = widest_tile(columns, b_rows)
    num_m, num_n = len(rows), columns * b_rows // block_n
    coords = [tile_coords(t, num_m, num_n, GROUP_M) for t in range(num_m * num_n)]
    costs = [small_cost if rows[m][1] <= 64 else 1.0 for m, _ in coords]
    start = schedule(costs, ctas, dynamic)
    end = [s + c for s, c in zip(start, costs)]
    makespan = max(end)
    spreads, sets = [], []
    a_tile, b_tile = BLOCK_M * k * 2, block_n * k * 2
    for i in range(1, samples):
        now = makespan * i / samples
        live = [t for t in range(len(costs)) if start[t] <= now < end[t]]
        if not live:
            continue
        spreads.append(max(live) - min(live))
        a_tiles = {coords[t][0] for t in live}
        b_tiles = {(rows[coords[t][0]][0], coords[t][1]) for t in live}  # (expert, column tile)
        sets.append((len(a_tiles) * a_tile + len(b_tiles) * b_tile) / 1e6)
    return Report(len(costs), sum(1 for m, _ in coords if rows[m][1] <= 64), makespan,
                  sum(spreads) / len(spreads), max(spreads), sum(sets) / len(sets), max(sets))


def main() -> None:
    from side_by_side import SHAPES  # benchmarks/, next to this script

    by_name = {s.name: s for s in SHAPES}
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="deepseek", choices=sorted(by_name))
    ap.add_argument("--ragged", action="store_true")
    ap.add_argument("--tokens-per-expert", type=int, help="override the shape's")
    ap.add_argument("--small-tile-cost", type=float, default=1.0,
                    help="cost of a tile of at most 64 rows (a full tile costs 1)")
    ap.add_argument("--ctas", type=int, default=132, help="persistent CTAs (the H200's SMs)")
    a = ap.parse_args()
    s = by_name[a.shape]
    layer = Layer(s.experts, a.tokens_per_expert or s.tokens_per_expert, s.hidden, s.ffn,
                  s.activation in GLU)  # fmt: skip
    print(f"{a.shape}{' ragged' if a.ragged else ''}, small-tile cost {a.small_tile_cost}, "
          f"{a.ctas} CTAs")  # fmt: skip
    print("kernel  schedule  tiles  small  makespan  spread mean/max  working set MB mean/max")
    for fc in (1, 2):
        for dynamic in (False, True):
            r = replay(layer, a.ragged, fc, a.small_tile_cost, a.ctas, dynamic)
            print(f"FC{fc}     {'dynamic' if dynamic else 'static ':8s} {r.tiles:6d} "
                  f"{r.small_tiles:6d} {r.makespan:9.1f}  {r.mean_spread:7.0f} /{r.max_spread:5d}"
                  f"  {r.mean_working_set_mb:8.0f} /{r.max_working_set_mb:5.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
