"""AMD GPUs' memory and users through amdsmi, and the source each GPU gets by vendor.

amdsmi needs an AMD GPU; here ``tests/amdstub/amdsmi`` (a stand-in with the
call names and return shapes of the amdsmi 7.0.2 wheel) checks what krexd
makes of them: VRAM totals and use in bytes, per-process VRAM summed by pid,
the live users the fail-closed check compares with the gate, GPUs matched by
PCI address, and the fallbacks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace

import pytest

from krexd.hardware.inventory import GpuInfo
from krexd.memory import opening, sources
from krexd.memory.amd_source import AmdSmiSource
from tests.support import REPO

STUBS = str(REPO / "tests" / "amdstub")

NV = GpuInfo(0, "NVIDIA H100", 80 << 30, 50 << 20, None, False, "00000000:18:00.0", "GPU-n0", 0)
AMD0 = GpuInfo(1, "AMD Instinct MI300X", 192 << 30, 4 << 20, None, False, "0000:0c:00.0",
               "GPU-9a1b2c3d4e5f6071", None, vendor="amd", render_minor=128)  # fmt: skip
AMD1 = GpuInfo(2, "AMD Instinct MI300X", 192 << 30, 4 << 20, None, False, "0000:22:00.0",
               "GPU-0011223344556677", None, vendor="amd", render_minor=129)  # fmt: skip


@pytest.fixture
def smi(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The stand-in ``amdsmi`` with two GPUs; a dead pid (an exited process) on GPU 0."""
    monkeypatch.syspath_prepend(STUBS)
    sys.modules.pop("amdsmi", None)
    import amdsmi

    dead = subprocess.Popen(["true"])
    dead.wait()
    amdsmi.GPUS[:] = [
        {"bdf": "0000:0c:00.0", "total": 192 << 30, "used": 30 << 30,
         "procs": [(os.getpid(), 4 << 30), (os.getpid(), 1 << 30), (dead.pid, 2 << 30)]},
        {"bdf": "0000:22:00.0", "total": 192 << 30, "used": 1 << 30, "procs": []},
    ]  # fmt: skip
    amdsmi.CALLS.update(init=0, shut_down=0)
    amdsmi.FAIL_INIT = False
    yield amdsmi
    sys.modules.pop("amdsmi", None)


def test_vram_in_bytes_and_per_process_use_by_pid(smi: ModuleType) -> None:
    src = AmdSmiSource([AMD0, AMD1])
    views = src.read()
    v = views[1]
    assert (v.total, v.used, v.source) == (192 << 30, 30 << 30, "amdsmi")
    assert v.per_pid is not None and v.per_pid[os.getpid()] == 5 << 30  # two entries, summed
    assert os.getpid() in v.listed
    assert views[2].per_pid == {} and views[2].used == 1 << 30
    src.close()
    assert smi.CALLS == {"init": 1, "shut_down": 1}
    assert src.read() == {} and src.users(1) is None  # closed


def test_users_are_the_live_processes_amdsmi_lists(smi: ModuleType) -> None:
    src = AmdSmiSource([AMD0, AMD1])
    assert src.users(1) == {os.getpid()}  # the exited process is nobody's user
    assert src.users(2) == set()
    assert src.users(0) is None  # not one of its GPUs
    src.close()


def test_gpus_are_matched_by_pci_address(smi: ModuleType) -> None:
    smi.GPUS.reverse()  # amdsmi's order need not be HIP's
    src = AmdSmiSource([AMD0, AMD1])
    assert src.read()[1].used == 30 << 30
    smi.GPUS[0]["bdf"] = "0000:22:00.1"  # another function of the same device still matches
    assert AmdSmiSource([AMD1]).read()[2].used == 1 << 30


def test_a_gpu_amdsmi_does_not_list_falls_back_to_the_shim_counts(smi: ModuleType) -> None:
    smi.GPUS.pop()
    with pytest.raises(RuntimeError, match="no GPU at 0000:22:00.0"):
        AmdSmiSource([AMD0, AMD1])
    src = opening.open_source([AMD0, AMD1])
    assert isinstance(src, sources.NoSource) and src.read()[2].total == 192 << 30


def test_amdsmi_that_cannot_start_falls_back(smi: ModuleType) -> None:
    smi.FAIL_INIT = True
    assert opening.open_source([AMD0]).name == "shim"


def nvml() -> SimpleNamespace:
    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 << 30, used=2 << 30),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=1, usedGpuMemory=1)],
    )


def test_a_mixed_host_reads_each_gpu_through_its_vendors_source(
    smi: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml())
    src = opening.open_source([NV, AMD0, AMD1])
    assert src.name == "nvml+amdsmi"
    views = src.read()
    assert {i: v.source for i, v in views.items()} == {0: "nvml", 1: "amdsmi", 2: "amdsmi"}
    assert views[0].used == 2 << 30 and views[1].used == 30 << 30
    assert src.users(1) == {os.getpid()} and src.users(0) == {1}
    assert src.users(7) is None
    src.close()
    assert smi.CALLS["shut_down"] == 1


def test_simulated_amd_gpus_read_the_fake_driver_state() -> None:
    fake = GpuInfo(0, "fake AMD GPU 0", 80 << 30, 50 << 20, None, True, vendor="amd")
    assert isinstance(opening.open_source([fake]), sources.FakeStateSource)


def test_an_nvidia_only_host_is_read_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml())
    assert isinstance(opening.open_source([NV]), sources.NvmlSource)
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # never imported there
    assert opening.open_source([NV]).name == "nvml"
