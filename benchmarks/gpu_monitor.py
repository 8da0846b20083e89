"""What the GPU's clock and power did while a benchmark case ran, from `nvidia-smi`.

On an H200 the BF16 GEMMs run their tensor cores ~95 % busy and the board then holds its
700 W limit by lowering the SM clock (throttle reason "software power cap"), so a TFLOP/s
figure means little without the clock it ran at. GpuMonitor samples

    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active
               --format=csv,noheader,nounits -i INDEX -lms PERIOD

in a background process while a case runs; summary() gives the mean SM clock and power over the
loaded samples (power at least half the case's highest: a case also compiles and waits on the
CPU) and the share of them throttled by the power cap. Where nvidia-smi is missing or fails, the
summary is None and the benchmark goes on without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import Optional

# clocks_event_reasons bits (nvidia-smi --help-query-gpu): 0x4 software power cap, 0x8 hardware
# slowdown, 0x20 software thermal slowdown, 0x40 hardware thermal slowdown, 0x80 power brake.
POWER_CAP = 0x4
THERMAL = 0x20 | 0x40


@dataclass
class Sample:
    sm_clock_mhz: float
    power_w: float
    reasons: int


def parse_sample(line: str) -> Optional[Sample]:
    """One line of the query above ("1980, 612.35, 0x0000000000000004"), or None when it is not
    one (a header, "[N/A]", an error message)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        return Sample(float(parts[0]), float(parts[1]), int(parts[2], 16))
    except ValueError:
        return None


def summarize(samples: list[Sample]) -> Optional[dict]:
    """Mean SM clock and power over the loaded samples and the share of them power-capped."""
    if not samples:
        return None
    peak = max(s.power_w for s in samples)
    loaded = [s for s in samples if s.power_w >= peak / 2]
    n = len(loaded)
    return {
        "samples": len(samples),
        "loaded_samples": n,
        "sm_clock_mhz": round(sum(s.sm_clock_mhz for s in loaded) / n, 1),
        "power_w": round(sum(s.power_w for s in loaded) / n, 1),
        "peak_power_w": round(peak, 1),
        "power_capped_pct": round(100.0 * sum(bool(s.reasons & POWER_CAP) for s in loaded) / n, 1),
        "thermal_pct": round(100.0 * sum(bool(s.reasons & THERMAL) for s in loaded) / n, 1),
    }


class GpuMonitor:
    """Context manager: samples GPU `index` every `period_ms` while the block runs."""

    def __init__(self, index: int = 0, period_ms: int = 200, command: str = "nvidia-smi"):
        self.index, self.period_ms, self.command = index, period_ms, command
        self.samples: list[Sample] = []
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None

    def __enter__(self) -> "GpuMonitor":
        exe = shutil.which(self.command)
        if exe is None:
            return self
        query = "clocks.sm,power.draw,clocks_event_reasons.active"
        try:
            self._proc = subprocess.Popen(
                [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits",
                 "-i", str(self.index), "-lms", str(self.period_ms)],  # fmt: skip
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                start_new_session=True)  # its own process group: stopped as a whole  # fmt: skip
        except OSError:
            self._proc = None
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
                self._proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def summary(self) -> Optional[dict]:
        return summarize(list(self.samples))
