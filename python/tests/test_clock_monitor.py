"""benchmarks/gpu_monitor.py: the clock and power record beside side_by_side.py's numbers."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import time
from pathlib import Path

MONITOR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_monitor.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_monitor", MONITOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_monitor"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_query_line_parses_and_anything_else_is_skipped():
    m = load()
    s = m.parse_sample("1980, 612.35, 0x0000000000000004\n")
    assert (s.sm_clock_mhz, s.power_w, s.reasons) == (1980.0, 612.35, 4)
    for line in ("clocks.sm [MHz], power.draw [W], clocks_event_reasons.active", "[N/A], 80, 0x0",
                 "No devices were found", "1980, 612"):  # fmt: skip
        assert m.parse_sample(line) is None


def test_the_summary_counts_loaded_samples_and_the_power_cap_bit():
    m = load()
    S = m.Sample
    samples = [S(345, 80, 0x1), S(1500, 690, 0x4), S(1400, 700, 0x4), S(1980, 400, 0x0)]
    got = m.summarize(samples)
    # Loaded: power >= 350 W (half of 700): the last three.
    assert got["samples"] == 4 and got["loaded_samples"] == 3
    assert got["sm_clock_mhz"] == round((1500 + 1400 + 1980) / 3, 1)
    assert got["power_w"] == round((690 + 700 + 400) / 3, 1)
    assert got["peak_power_w"] == 700
    assert got["power_capped_pct"] == round(200 / 3, 1)
    assert got["thermal_pct"] == 0
    assert m.summarize([]) is None


def test_without_nvidia_smi_the_summary_is_none():
    m = load()
    with m.GpuMonitor(command="gmjit-no-such-nvidia-smi") as mon:
        pass
    assert mon.summary() is None


def test_samples_stream_from_the_command_while_the_block_runs(tmp_path, monkeypatch):
    m = load()
    fake = tmp_path / "fake-smi"
    fake.write_text("#!/bin/sh\n"
                    "[ \"$1\" = --help-query-gpu ] && { echo clocks_event_reasons.active; exit 0; }\n"
                    "for i in 1 2 3; do echo '1500, 650.5, 0x0000000000000004'; done\n"
                    "echo 'garbage'\nsleep 30\n")  # fmt: skip
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    with m.GpuMonitor(command="fake-smi") as mon:
        while len(mon.samples) < 3 and time.monotonic() - started < 5:
            time.sleep(0.01)
    got = mon.summary()
    assert got["samples"] == 3 and got["sm_clock_mhz"] == 1500 and got["power_capped_pct"] == 100
    assert time.monotonic() - started < 15  # the sampler was stopped, not waited for


def test_the_reasons_field_follows_the_driver(tmp_path):
    m = load()
    for i, (help_text, field) in enumerate((
            ("clocks_event_reasons.active", "clocks_event_reasons.active"),
            ("clocks_throttle_reasons.active", "clocks_throttle_reasons.active"),
            ("", "clocks_event_reasons.active"))):  # fmt: skip
        fake = tmp_path / f"smi{i}"  # one path each: the answer is cached per nvidia-smi
        fake.write_text(f"#!/bin/sh\necho '{help_text}'\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        assert m.reasons_field(str(fake)) == field
    assert m.reasons_field(str(tmp_path / "missing")) == "clocks_event_reasons.active"


class FakeNvml:
    """libnvidia-ml's entry points EnergyCounter calls, with a counter the test sets."""

    def __init__(self, init_rc=0, handle_rc=0, energy_rc=0):
        self.init_rc, self.handle_rc, self.energy_rc = init_rc, handle_rc, energy_rc
        self.millijoules = 5_000
        self.asked = []

    def nvmlInit_v2(self):
        return self.init_rc

    def nvmlDeviceGetHandleByUUID(self, uuid, handle):
        self.asked.append(("uuid", uuid))
        return self.handle_rc

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        self.asked.append(("index", index.value))
        return self.handle_rc

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, out):
        out._obj.value = self.millijoules  # out is ctypes.byref(c_ulonglong)
        return self.energy_rc


def test_the_energy_counter_reads_millijoules_as_joules_by_uuid_or_index():
    m = load()
    nvml = FakeNvml()
    counter = m.EnergyCounter("GPU-1234", nvml=nvml)
    nvml.millijoules = 12_345
    assert counter.joules() == 12.345
    assert nvml.asked == [("uuid", b"GPU-1234")]
    nvml = FakeNvml()
    m.EnergyCounter("3", nvml=nvml)
    assert nvml.asked == [("index", 3)]


def test_the_energy_counter_is_none_where_nvml_the_device_or_the_counter_fails():
    m = load()
    for nvml in (FakeNvml(init_rc=1), FakeNvml(handle_rc=2), FakeNvml(energy_rc=3)):
        assert m.EnergyCounter("0", nvml=nvml).joules() is None
    assert m.EnergyCounter("not-an-index", nvml=FakeNvml()).joules() is None

    class OldNvml:  # a driver's NVML from before the energy counter
        def nvmlInit_v2(self):
            return 0

        def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
            return 0

    assert m.EnergyCounter("0", nvml=OldNvml()).joules() is None
