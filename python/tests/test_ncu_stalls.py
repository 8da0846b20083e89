"""benchmarks/ncu_stalls.py on the CPU: the source-page parser and summary on a CSV shaped like
ncu 2025's, and the runs' ncu commands against a stub `ncu`."""

from __future__ import annotations

import json
import stat
import sys

import pytest
from benchmark_scripts import load

REASONS = ["stall_barrier", "stall_long_sb", "stall_short_sb", "stall_wait"]
HEAD = (["Address", "Source", "Warp Stall Sampling (All Samples)",
         "Warp Stall Sampling (Not-issued Samples)", "# Samples"]
        + REASONS + [r + " (Not Issued)" for r in REASONS])  # fmt: skip


def source_csv(rows: list[tuple[str, str, list[int]]]) -> str:
    """ncu's messages, then the table: (address, SASS, samples per REASONS) per instruction."""
    lines = ["==PROF== Connected to process 1", ",".join(f'"{h}"' for h in HEAD)]
    for address, sass, counts in rows:
        cells = [address, sass, str(sum(counts)), str(sum(counts)), str(sum(counts))]
        cells += [f"{c:,}" for c in counts] + ["0"] * len(REASONS)
        lines.append(",".join(f'"{c}"' for c in cells))
    return "\n".join(lines) + "\n"


SAMPLE = source_csv([
    ("0x7f0000001000", "HGMMA.64x256x16.F32.BF16 R24, gdesc[UR20], R24", [0, 0, 0, 100]),
    ("0x7f0000001010", "@!P1 BRA 0x7f0000002000", [0, 1500, 0, 0]),
    ("0x7f0000001020", "S2R R164, SR_TID.X", [0, 600, 300, 100]),
    ("0x7f0000001030", "WARPGROUP.DEPBAR.LE gsb0, 0x1", [400, 0, 0, 0]),
])  # fmt: skip


def test_source_page_totals_offsets_and_main_reasons():
    ns = load("ncu_stalls")
    stalls = ns.parse_source_csv(SAMPLE)
    assert stalls.total == 3000
    assert stalls.reasons == {"barrier": 400, "long_sb": 2100, "short_sb": 300, "wait": 200}
    assert [line.offset for line in stalls.lines] == [0, 0x10, 0x20, 0x30]
    s2r = stalls.lines[2]
    assert s2r.sass == "S2R R164, SR_TID.X" and s2r.samples == 1000
    # 60 % long scoreboard, then 30 % short: together past the 80 % the summary names.
    assert ns.main_reasons(s2r) == "long_sb 60%, short_sb 30%"


def test_report_ranks_reasons_and_instructions_per_variant():
    ns = load("ncu_stalls")
    other = source_csv([("0x10", "BRA 0x20", [0, 0, 0, 50]), ("0x20", "NOP", [0, 0, 0, 50])])
    text = ns.report(["A: imm", "B: def"], [ns.parse_source_csv(SAMPLE),
                                            ns.parse_source_csv(other)], top=2)  # fmt: skip
    lines = text.splitlines()
    # Ranked by the largest share in any variant: B's wait, then A's long scoreboard.
    assert lines[1].split() == ["wait", "6.7", "100.0"]
    assert lines[2].split() == ["long_sb", "70.0", "0.0"]
    assert "samples" in text and "3000" in text
    a_top = lines[lines.index("A: imm: the 2 instructions with the most samples") + 1]
    assert a_top.startswith(" 50.0%  +0x00010  @!P1 BRA") and a_top.endswith("long_sb 100%")


def test_a_page_without_the_sampling_column_is_an_error():
    ns = load("ncu_stalls")
    with pytest.raises(ValueError, match="Warp Stall Sampling"):
        ns.parse_source_csv('"Address","Source"\n"0x0","NOP"\n')


# Records its argv and GMJIT_TEST_FLAG per call; `-o P` writes P.ncu-rep, `-i` prints SAMPLE.
STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps([sys.argv[1:], os.environ.get("GMJIT_TEST_FLAG")]) + "\\n")
if "-o" in sys.argv:
    open(sys.argv[sys.argv.index("-o") + 1] + ".ncu-rep", "w").write("report")
else:
    sys.stdout.write(open(os.environ["STUB_PAGE"]).read())
"""


def test_two_binaries_each_with_its_environment(tmp_path, monkeypatch, capsys):
    ns = load("ncu_stalls")
    stub = tmp_path / "ncu"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    log, page = tmp_path / "calls.jsonl", tmp_path / "page.csv"
    page.write_text(SAMPLE)
    monkeypatch.setenv("STUB_LOG", str(log))
    monkeypatch.setenv("STUB_PAGE", str(page))
    assert ns.main(["--ncu", str(stub), "--gmjit", "/a/build/cli/gmjit", "--gmjit",
                    "/b/build-gpu/cli/gmjit", "--env", "GMJIT_TEST_FLAG=1", "--kernel",
                    "fc2_dgrad", "--save-dir", str(tmp_path / "saved"),
                    "e64:--ragged:--tokens-per-expert=16"]) == 0  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 4  # profile + source page, per binary
    run_a, flag_a = calls[0]
    assert run_a[:4] == ["--set", "full", "--import-source", "no"]
    assert run_a[run_a.index("-k") + 1] == "regex:fc2_dgrad"
    assert run_a[run_a.index("/a/build/cli/gmjit"):] == [
        "/a/build/cli/gmjit", "bench", "--preset", "e64", "--ragged", "--tokens-per-expert", "16",
        "--repeats", "2"]  # fmt: skip
    assert flag_a is None and calls[2][1] == "1"  # --env follows the binary it names
    assert calls[1][0][:3] == ["-i", run_a[run_a.index("-o") + 1] + ".ncu-rep", "--page"]
    assert (tmp_path / "saved" / "source-B.csv").read_text() == SAMPLE
    header = capsys.readouterr().out.splitlines()[0]
    assert "A: build" in header and "B: build-gpu" in header


def test_env_before_any_binary_is_refused():
    ns = load("ncu_stalls")
    with pytest.raises(SystemExit, match="--env must follow"):
        ns.main(["--env", "X=1", "--gmjit", "g", "--kernel", "k", "e64"])
