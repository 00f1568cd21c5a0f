"""The GPU's state around a region, per vendor (krex_client.devicestate).

AMD SMI is not installed here and there is no AMD GPU: a stand-in
``amdsmi`` module gives chosen figures with the shapes of the real package's
``amdsmi_interface`` (amdsmi 7.0: dicts from ``amdsmi_get_clock_info`` and
``amdsmi_get_power_info``, ``"N/A"`` for a power figure it cannot read,
IntEnum clock and sensor types, exceptions for unsupported sensors).
"""

from __future__ import annotations

import enum
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from krex_client import devicestate, record

UUIDS = ("0aff74a1-0000-1000-80e6-1c4b5d6f8a01", "0aff74a1-0000-1000-80e6-1c4b5d6f8a02")


class ClkType(enum.IntEnum):
    SYS = 0
    GFX = 1
    MEM = 5


class TempType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1


class TempMetric(enum.IntEnum):
    CURRENT = 0


def _fake_amdsmi(gfx: int = 2100, hotspot: bool = True, power: Any = 550) -> Any:
    """A stand-in ``amdsmi``: two MI300X-like GPUs, handles 0 and 1."""
    sm: Any = types.ModuleType("amdsmi")
    sm.AmdSmiClkType, sm.AmdSmiTemperatureType = ClkType, TempType
    sm.AmdSmiTemperatureMetric = TempMetric
    sm.amdsmi_init = lambda: None
    sm.amdsmi_get_processor_handles = lambda: [0, 1]
    sm.amdsmi_get_gpu_device_uuid = lambda h: UUIDS[h]
    sm.amdsmi_get_gpu_device_bdf = lambda h: f"0000:{0x0C + h:02x}:00.0"
    sm.amdsmi_get_gpu_asic_info = lambda h: {"market_name": f"AMD Instinct MI300X #{h}"}

    def clock_info(h: int, kind: ClkType) -> dict[str, Any]:
        assert isinstance(kind, ClkType)
        if kind == ClkType.GFX:
            return {"clk": gfx + h, "min_clk": 500, "max_clk": 2100, "clk_locked": False}
        return {"clk": 1300, "min_clk": 900, "max_clk": 1300, "clk_locked": False}

    def temp(h: int, sensor: TempType, metric: TempMetric) -> int:
        if sensor == TempType.HOTSPOT and not hotspot:
            raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
        return 71 if sensor == TempType.HOTSPOT else 48

    sm.amdsmi_get_clock_info = clock_info
    sm.amdsmi_get_temp_metric = temp
    sm.amdsmi_get_power_info = lambda h: {"current_socket_power": power,
                                          "average_socket_power": "N/A"}  # fmt: skip
    return sm


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("KREX_GPU_VENDOR", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                 "ROCR_VISIBLE_DEVICES", "KREX_GPU", "KREX_GPU_PCI"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    return monkeypatch


def test_vendor_from_the_environment_and_torch(clean_env: pytest.MonkeyPatch) -> None:
    assert devicestate.vendor() == "nvidia"
    assert devicestate.vendor({"ROCR_VISIBLE_DEVICES": "GPU-1"}) == "amd"
    assert devicestate.vendor({"HIP_VISIBLE_DEVICES": "0"}) == "amd"
    # both worlds named: CUDA's variable wins unless krex run said otherwise
    both = {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "GPU-x"}
    assert devicestate.vendor(both) == "nvidia"
    assert devicestate.vendor({**both, "KREX_GPU_VENDOR": "AMD"}) == "amd"
    assert devicestate.vendor({"KREX_GPU_VENDOR": "intel"}) == "nvidia"  # unknown: ignored
    rocm_torch: Any = types.ModuleType("torch")
    rocm_torch.version = types.SimpleNamespace(hip="6.4.43482", cuda=None)
    clean_env.setitem(sys.modules, "torch", rocm_torch)
    assert devicestate.vendor() == "amd"
    rocm_torch.version = types.SimpleNamespace(hip=None, cuda="12.8")
    assert devicestate.vendor() == "nvidia"


def test_amd_figures_by_uuid(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setitem(sys.modules, "amdsmi", _fake_amdsmi(gfx=420))
    clean_env.setenv("ROCR_VISIBLE_DEVICES", "GPU-" + UUIDS[1].upper())
    rec_ = record.Recorder(str(tmp_path / "log"))
    assert isinstance(rec_.state, devicestate.AmdSmiState)
    assert rec_.device == {"name": "AMD Instinct MI300X #1", "uuid": UUIDS[1],
                           "sm_clock_max_mhz": 2100}  # fmt: skip
    entry = rec_.sample()
    assert entry == {"sm_clock_mhz": 421, "mem_clock_mhz": 1300, "temperature_c": 71,
                     "power_w": 550.0}  # fmt: skip
    rec = rec_.record({"epoch": 1, "region_ms": 1.0, "launches": 1}, entry, entry, (0, 0))
    assert [w["kind"] for w in rec["warnings"]] == ["cold_clock"]  # 421 of 2100 MHz


def test_amd_fallbacks_and_unreadable_figures(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setitem(sys.modules, "amdsmi", _fake_amdsmi(hotspot=False, power="N/A"))
    clean_env.setenv("HIP_VISIBLE_DEVICES", "0")
    # HIP's index 0 of a filtered view names none of AMD SMI's GPUs: nulls, not a guess
    assert not devicestate.open_state().available
    clean_env.setenv("KREX_GPU_PCI", "0000:0c:00.0")
    state = devicestate.open_state()
    assert state.available and state.sm_clock() == 2100
    sample = state.sample()
    assert sample["temperature_c"] == 48  # no hotspot sensor: the edge sensor's
    assert sample["power_w"] is None  # neither figure readable: null, not 0


def test_amd_gpu_not_found_or_no_amdsmi_gives_nulls(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setitem(sys.modules, "amdsmi", _fake_amdsmi())
    clean_env.setenv("ROCR_VISIBLE_DEVICES", "GPU-ffffffffffffffff")
    state = devicestate.open_state()
    assert not state.available
    assert state.sample() == dict.fromkeys(devicestate.SAMPLE_KEYS)
    assert state.sm_clock() is None and state.sm_clock_max() is None
    clean_env.setitem(sys.modules, "amdsmi", None)  # import fails
    clean_env.setenv("ROCR_VISIBLE_DEVICES", "0")
    assert set(devicestate.open_state().device().values()) == {None}


def test_the_gpu_krexd_binds_is_the_one_amd_smi_reads(clean_env: pytest.MonkeyPatch) -> None:
    """krexd's AMD binding (HIP device 0 of a filtered view) names the GPU by PCI address for
    AMD SMI, which sees every GPU: the second GPU here, not AMD SMI's index 0."""
    from krexd.hardware import vendors
    from krexd.hardware.inventory import GpuInfo

    info = GpuInfo(1, "MI300X", 192 << 30, 4 << 20, None, False, "0000:0d:00.0",
                   "GPU-9a1b2c3d4e5f6071", None, vendor="amd", render_minor=129)  # fmt: skip
    for key, value in vendors.binding(info).items():
        clean_env.setenv(key, value)
    clean_env.setitem(sys.modules, "amdsmi", _fake_amdsmi())
    assert devicestate.vendor() == "amd"
    state = devicestate.open_state()
    assert state.device()["uuid"] == UUIDS[1]  # handle 1 is at 0000:0d:00.0
    clean_env.setenv("KREX_GPU_PCI", "0d:00.0")  # no domain: the same GPU
    assert devicestate.open_state().device()["uuid"] == UUIDS[1]
    clean_env.setenv("KREX_GPU_PCI", "0000:99:00.0")
    assert not devicestate.open_state().available  # not found: nulls, never another GPU
