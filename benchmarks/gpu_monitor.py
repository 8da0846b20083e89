"""What the GPU's clock and power did while a benchmark case ran, from `nvidia-smi`, and the
energy a timed block spent, from NVML's energy counter.

On an H200 the BF16 GEMMs run their tensor cores ~95 % busy and the board then holds its
700 W limit by lowering the SM clock (throttle reason "software power cap"), so a TFLOP/s
figure means little without the clock it ran at. GpuMonitor samples

    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active
               --format=csv,noheader,nounits -i INDEX -lms PERIOD

in a background process while a case runs; summary() gives the mean SM clock and power over the
loaded samples (power at least half the case's highest: a case also compiles and waits on the
CPU) and the share of them throttled by the power cap. Where nvidia-smi is missing or fails, the
summary is None and the benchmark goes on without it.

EnergyCounter reads NVML's total energy counter (millijoules since the driver loaded; Volta and
newer) through ctypes, so no NVML package is needed. Under the power cap the clock follows the
energy a kernel spends per FLOP: joules per call say why one implementation's time moves with
the GPU's heat while another's does not (docs/PERFORMANCE.md, session 42). Where NVML, the
device or its counter is missing, joules() is None.
"""

from __future__ import annotations

import ctypes
import functools
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


@functools.lru_cache(maxsize=None)  # asked once per nvidia-smi, not once per case
def reasons_field(smi: str) -> str:
    """The throttle-reasons field this nvidia-smi knows: drivers before 535 call it
    clocks_throttle_reasons."""
    try:
        help_text = subprocess.run([smi, "--help-query-gpu"], capture_output=True, text=True,
                                   timeout=10).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "clocks_event_reasons.active"
    if "clocks_event_reasons" in help_text or "clocks_throttle_reasons" not in help_text:
        return "clocks_event_reasons.active"
    return "clocks_throttle_reasons.active"


class GpuMonitor:
    """Context manager: samples GPU `gpu` (an nvidia-smi -i id: an index in nvidia-smi's own
    order, or better a "GPU-<uuid>", which names the device CUDA uses whatever
    CUDA_VISIBLE_DEVICES says) every `period_ms` while the block runs."""

    def __init__(self, gpu: str = "0", period_ms: int = 200, command: str = "nvidia-smi"):
        self.gpu, self.period_ms, self.command = str(gpu), period_ms, command
        self.samples: list[Sample] = []
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None

    def __enter__(self) -> "GpuMonitor":
        smi = shutil.which(self.command)
        if smi is None:
            return self
        query = f"clocks.sm,power.draw,{reasons_field(smi)}"
        argv = [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", self.gpu,
                "-lms", str(self.period_ms)]  # fmt: skip
        stdbuf = shutil.which("stdbuf")  # line-buffered, so that short cases get their samples
        if stdbuf:
            argv = [stdbuf, "-oL"] + argv
        try:
            self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True, start_new_session=True)  # fmt: skip
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
        if self._proc is None:
            return
        # Its own process group (start_new_session): stopped as a whole, stdbuf included.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self._proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def summary(self) -> Optional[dict]:
        return summarize(list(self.samples))


def cuda_device_id(index: int) -> str:
    """nvidia-smi's id of CUDA device `index` (torch's numbering): "GPU-<uuid>" where torch
    reports the UUID, else the index (right when CUDA_VISIBLE_DEVICES is unset and the orders
    agree)."""
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except (ImportError, AssertionError, RuntimeError):  # no CUDA torch: the index will do
        uuid = None
    if uuid is None:
        return str(index)
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


class EnergyCounter:
    """NVML's energy counter of GPU `gpu` (an id as GpuMonitor takes: "GPU-<uuid>" or an NVML
    index). `nvml` replaces the loaded libnvidia-ml (tests pass a stand-in)."""

    def __init__(self, gpu: str = "0", nvml=None):
        self._nvml = None
        self._handle = ctypes.c_void_p()
        if nvml is None:
            try:
                nvml = ctypes.CDLL("libnvidia-ml.so.1")
            except OSError:
                return
        try:
            if nvml.nvmlInit_v2() != 0:
                return
            gpu = str(gpu)
            if gpu.startswith("GPU-"):
                rc = nvml.nvmlDeviceGetHandleByUUID(gpu.encode(), ctypes.byref(self._handle))
            else:
                rc = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(gpu)),
                                                        ctypes.byref(self._handle))  # fmt: skip
        except (AttributeError, ValueError):  # an NVML without these entry points; a bad id
            return
        if rc != 0:
            return
        self._nvml = nvml
        if self.joules() is None:  # the device has no counter
            self._nvml = None

    def joules(self):
        """The counter in joules, or None where it cannot be read."""
        read = getattr(self._nvml, "nvmlDeviceGetTotalEnergyConsumption", None)
        if read is None:  # no NVML, or one older than the counter
            return None
        mj = ctypes.c_ulonglong()
        if read(self._handle, ctypes.byref(mj)) != 0:
            return None
        return mj.value / 1e3
