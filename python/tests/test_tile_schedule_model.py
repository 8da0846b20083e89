"""benchmarks/tile_schedule_model.py: the CPU model of the Hopper kernels' persistent tile
schedule (kernel_templates/sm90_grouped_gemm.cuh, expert_schedule.cuh's tile_coords)."""

from __future__ import annotations

from benchmark_scripts import load


def _model():
    return load("tile_schedule_model")


def test_tile_coords_walks_group_rows_per_column_and_covers_every_tile_once():
    m = _model()
    num_m, num_n = 11, 3  # a last group of 3 row tiles
    coords = [m.tile_coords(t, num_m, num_n, 4) for t in range(num_m * num_n)]
    assert coords[:5] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]
    assert coords[24:27] == [(8, 0), (9, 0), (10, 0)]
    assert sorted(coords) == [(i, j) for i in range(num_m) for j in range(num_n)]


def test_row_tiles_split_each_expert_in_block_rows_and_skip_empty_experts():
    m = _model()
    assert m.row_tiles([300, 0, 128, 5]) == [(0, 128), (0, 128), (0, 44), (2, 128), (3, 5)]


def test_tile_widths_follow_the_codegen_choice():
    m = _model()
    assert m.widest_tile(14336, 2) == 256  # mixtral FC1: 128 gate + 128 lin rows
    assert m.widest_tile(2880, 2) == 192  # gpt-oss FC1: 96 + 96 (session 7)
    assert m.widest_tile(1408, 1) == 128  # e64 FC2 dgrad width


def test_equal_costs_keep_the_tiles_in_flight_one_wave_wide_under_either_schedule():
    m = _model()
    layer = m.Layer(experts=16, tokens_per_expert=256, hidden=1024, ffn=1024, glu=True)
    for dynamic in (False, True):
        r = m.replay(layer, ragged=False, fc=1, small_cost=1.0, ctas=8, dynamic=dynamic)
        assert r.max_spread == 7 and r.small_tiles == 0


def test_cheap_small_tiles_spread_the_static_schedule_but_not_the_dynamic_one():
    m = _model()
    layer = m.Layer(experts=32, tokens_per_expert=512, hidden=1024, ffn=1024, glu=True)
    static = m.replay(layer, ragged=True, fc=1, small_cost=0.5, ctas=16, dynamic=False)
    dynamic = m.replay(layer, ragged=True, fc=1, small_cost=0.5, ctas=16, dynamic=True)
    assert static.small_tiles > 0
    assert static.max_spread > 2 * dynamic.max_spread
    assert dynamic.mean_working_set_mb < static.mean_working_set_mb
    assert dynamic.makespan <= static.makespan
