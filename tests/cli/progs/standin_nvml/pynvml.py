"""A stand-in ``pynvml`` for the clock warm-up tests (put this folder on PYTHONPATH).

The SM clock reads ``STANDIN_NVML_COLD_MHZ`` (default 990) for the first
``STANDIN_NVML_COLD_READS`` reads of this process (default: every read),
then 1980 MHz, the maximum.  Other figures are fixed.
"""

from __future__ import annotations

import os
from typing import Any

NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
MAX_MHZ = 1980
_sm_reads = 0


def nvmlInit() -> None:  # noqa: N802 - pynvml's names
    pass


def nvmlDeviceGetHandleByIndex(index: int) -> Any:  # noqa: N802
    return ("idx", index)


def nvmlDeviceGetHandleByUUID(uuid: str) -> Any:  # noqa: N802
    return ("uuid", uuid)


def nvmlDeviceGetName(handle: Any) -> bytes:  # noqa: N802
    return b"Stand-in H200"


def nvmlDeviceGetUUID(handle: Any) -> str:  # noqa: N802
    return "GPU-standin"


def nvmlDeviceGetMaxClockInfo(handle: Any, clock: int) -> int:  # noqa: N802
    return MAX_MHZ if clock == NVML_CLOCK_SM else 2619


def nvmlDeviceGetClockInfo(handle: Any, clock: int) -> int:  # noqa: N802
    global _sm_reads
    if clock != NVML_CLOCK_SM:
        return 2619
    _sm_reads += 1
    cold = os.environ.get("STANDIN_NVML_COLD_READS", "")
    if cold and _sm_reads > int(cold):
        return MAX_MHZ
    return int(os.environ.get("STANDIN_NVML_COLD_MHZ", "990"))


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:  # noqa: N802
    return 41


def nvmlDeviceGetPowerUsage(handle: Any) -> int:  # noqa: N802
    return 123_456
