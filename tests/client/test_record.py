"""The region record's parts without krexd: NVML figures, warnings, appends.

The end-to-end record (real krexd, shim and fake driver) is checked in
tests/cli/test_region_log.py; the real NVML in tests/gpu/test_gpu_region_log.py.
Here a stand-in ``pynvml`` module gives chosen clocks, so the warning rules
and the null-for-absent rule can be asserted exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from krex_client import devicestate, record


def _fake_pynvml(sm_mhz: int, power_fails: bool = False) -> types.ModuleType:
    nv: Any = types.ModuleType("pynvml")
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("idx", i)
    nv.nvmlDeviceGetHandleByUUID = lambda u: ("uuid", u)
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetUUID = lambda h: "GPU-1234" if h[0] == "uuid" else "GPU-by-index"
    nv.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980
    nv.nvmlDeviceGetClockInfo = lambda h, c: sm_mhz if c == 1 else 2619
    nv.nvmlDeviceGetTemperature = lambda h, s: 41

    def power(h: Any) -> int:
        if power_fails:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 123_456

    nv.nvmlDeviceGetPowerUsage = power
    return nv


def _figures(**kw: Any) -> dict[str, Any]:
    base = {"epoch": 1, "region_ms": 2.0, "other_streams_ms": None, "launches": 3}
    return {**base, **kw}


def test_nvml_figures_and_a_cold_clock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(sm_mhz=345))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    rec_ = record.Recorder(str(tmp_path / "log"))
    assert rec_.device == {"name": "NVIDIA H200", "uuid": "GPU-1234", "sm_clock_max_mhz": 1980}
    entry = rec_.sample()
    assert entry == {"sm_clock_mhz": 345, "mem_clock_mhz": 2619, "temperature_c": 41,
                     "power_w": 123.456}  # fmt: skip
    rec = rec_.record(_figures(), entry, entry, (0, 0))
    assert [w["kind"] for w in rec["warnings"]] == ["cold_clock"]
    assert "17%" in rec["warnings"][0]["message"]


def test_a_warm_clock_and_an_unsupported_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(sm_mhz=1980, power_fails=True))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("KREX_GPU", "3")
    rec_ = record.Recorder("/nonexistent/log")
    assert rec_.device["uuid"] == "GPU-by-index"  # no UUID visible: KREX_GPU's index
    entry = rec_.sample()
    assert entry["power_w"] is None  # NVML could not say: null, not 0
    assert rec_.record(_figures(), entry, entry, (0, 0))["warnings"] == []


def test_without_pynvml_every_figure_is_null(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    rec_ = record.Recorder("/nonexistent/log")
    assert set(rec_.device.values()) == {None}
    entry = rec_.sample()
    assert entry == dict.fromkeys(devicestate.SAMPLE_KEYS)
    assert rec_.record(_figures(), entry, entry, (0, 0))["warnings"] == []


def test_timing_outside_warns_once_per_new_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    rec_ = record.Recorder("/nonexistent/log")
    null = dict.fromkeys(devicestate.SAMPLE_KEYS)

    def kinds(outside: tuple[int, int], other: float | None = None) -> list[str]:
        rec = rec_.record(_figures(other_streams_ms=other), null, null, outside)
        return [w["kind"] for w in rec["warnings"]]

    assert kinds((5, 0)) == []  # event records alone (stream ordering) do not warn
    assert kinds((7, 1)) == ["timing_outside_region"]
    assert kinds((7, 1)) == []  # nothing new since the previous region
    assert kinds((7, 1), other=record.OTHER_STREAMS_WARN_MS / 2) == []
    assert kinds((7, 1), other=3.0) == ["work_on_other_stream"]


APPENDER = """
import sys
from krex_client import devicestate, record
r = record.Recorder(sys.argv[1])
for i in range(300):
    r.append({"who": sys.argv[2], "i": i, "pad": "x" * 3000})
"""


def test_processes_append_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "regions.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(log), str(n)]) for n in range(4)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 1200
    for n in range(4):
        assert [r["i"] for r in lines if r["who"] == str(n)] == list(range(300))
