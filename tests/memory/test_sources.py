"""Device-memory sources: what krexd takes from NVML, and the fallbacks.

NVML itself needs a GPU (the H200 benchmark exercises it); here a stand-in
``pynvml`` module with NVML's call names and result shapes checks what krexd
makes of them: totals, per-process figures summed by pid, a missing
per-process figure (MPS clients, other pid namespaces) reported as "none"
so the shim's counts are used, and the fallback when NVML is unavailable.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from krexd.hardware.inventory import GpuInfo
from krexd.memory import opening, sources
from tests.fakecuda.harness import FakeCuda, read_step

GPU = GpuInfo(0, "test GPU", 80 << 30, 50 << 20, None, False)


def nvml(processes: list[Any]) -> SimpleNamespace:
    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 << 30, used=30 << 30),
        nvmlDeviceGetComputeRunningProcesses=lambda h: processes,
    )


def test_nvml_per_process_usage_by_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    procs = [
        SimpleNamespace(pid=10, usedGpuMemory=4 << 30),
        SimpleNamespace(pid=11, usedGpuMemory=1 << 30),
        SimpleNamespace(pid=10, usedGpuMemory=1 << 30),  # a second context of pid 10
    ]
    monkeypatch.setitem(sys.modules, "pynvml", nvml(procs))
    src = opening.open_source([GPU])
    assert src.name == "nvml"
    view = src.read()[0]
    assert (view.total, view.used, view.source) == (80 << 30, 30 << 30, "nvml")
    assert view.per_pid == {10: 5 << 30, 11: 1 << 30}
    src.close()


def test_nvml_without_per_process_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    procs = [SimpleNamespace(pid=10, usedGpuMemory=None)]  # e.g. an MPS client
    monkeypatch.setitem(sys.modules, "pynvml", nvml(procs))
    view = sources.NvmlSource([GPU]).read()[0]
    assert view.per_pid is None and view.used == 30 << 30
    assert view.listed == {10}  # listed all the same: who has the GPU open is known


def test_without_nvml_the_inventory_total_and_the_shim_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    src = opening.open_source([GPU])
    assert src.name == "shim"
    view = src.read()[0]
    assert (view.total, view.used, view.per_pid) == (80 << 30, None, None)


def test_fake_state_path_follows_the_fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREX_FAKE_STATE", "/x/state")
    assert sources.fake_state_path() == "/x/state"
    monkeypatch.delenv("KREX_FAKE_STATE")
    monkeypatch.setenv("KREX_FAKE_TIMELINE", "/x/tl")
    assert sources.fake_state_path() == "/x/tl.state"


def test_fake_source_before_any_fake_process_ran(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("KREX_FAKE_MEM_BYTES", "2G")
    src = sources.FakeStateSource([GPU], str(tmp_path / "absent"))
    assert src.read()[0] == sources.DeviceMemory(2 << 30, 0, {}, "fake")


def test_fake_source_reads_what_the_fake_driver_writes(fc: FakeCuda) -> None:
    """krexd's reader against the writer of the ``rexfksv3`` state file (interfaces.md)."""
    env = fc.env(KREX_FAKE_MEM_BYTES="1G", KREX_FAKE_GPUS="2")
    holder = fc.alloc_proc("device=1", "alloc=300M", "wait", env=env)
    try:
        assert read_step(holder)["rc"] == 0 and read_step(holder)["rc"] == 0
        assert read_step(holder) == {"op": "wait"}
        gpus = [GpuInfo(i, "sim", 80 << 30, 50 << 20, None, True) for i in (0, 1)]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("KREX_FAKE_MEM_BYTES", "1G")
            view = sources.FakeStateSource(gpus, str(fc.state_path)).read()
        assert view[1] == sources.DeviceMemory(1 << 30, 300 << 20, {holder.pid: 300 << 20}, "fake")
        assert view[0].used == 0
    finally:
        holder.kill()
        holder.wait()
    # A process that is gone counts for nothing (the driver reclaims it later).
    assert sources.FakeStateSource(gpus, str(fc.state_path)).read()[1].used == 0
