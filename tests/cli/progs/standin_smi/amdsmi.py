"""A stand-in ``amdsmi`` for the clock warm-up tests (put this folder on PYTHONPATH).

One AMD GPU, the one krexd bound the command to (``KREX_GPU_PCI``,
``KREX_GPU_UUID``), with the shapes ``krex_client.devicestate`` reads
(amdsmi 7.0's dicts).  Its GFX clock is ``standin_clock``'s: cold for the
first ``STANDIN_SMI_COLD_READS`` reads of the current clock (``clk``; the
maximum, ``max_clk``, is no read), then warm.  Other figures are fixed.
"""

from __future__ import annotations

import enum
import os
from typing import Any

from standin_clock import MAX_MHZ, sm_clock


class AmdSmiClkType(enum.IntEnum):
    GFX = 0
    MEM = 4


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


class _GfxClock(dict[str, Any]):
    """``amdsmi_get_clock_info``'s dict for GFX: its ``clk`` is read when asked for."""

    def get(self, key: str, default: Any = None) -> Any:
        return sm_clock() if key == "clk" else super().get(key, default)


def amdsmi_init() -> None:
    pass


def amdsmi_get_processor_handles() -> list[int]:
    return [0]


def amdsmi_get_gpu_device_bdf(handle: int) -> str:
    return os.environ.get("KREX_GPU_PCI", "0000:0c:00.0")


def amdsmi_get_gpu_device_uuid(handle: int) -> str:
    return os.environ.get("KREX_GPU_UUID", "GPU-standin")


def amdsmi_get_gpu_asic_info(handle: int) -> dict[str, Any]:
    return {"market_name": "Stand-in MI300X"}


def amdsmi_get_clock_info(handle: int, kind: AmdSmiClkType) -> dict[str, Any]:
    if kind == AmdSmiClkType.GFX:
        return _GfxClock(max_clk=MAX_MHZ, min_clk=500)
    return {"clk": 2619, "max_clk": 2619, "min_clk": 900}


def amdsmi_get_temp_metric(
    handle: int, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric
) -> int:
    return 41


def amdsmi_get_power_info(handle: int) -> dict[str, Any]:
    return {"current_socket_power": 123, "average_socket_power": 120}
