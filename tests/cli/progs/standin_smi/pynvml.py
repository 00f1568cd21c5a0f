"""A stand-in ``pynvml`` for the clock warm-up tests (put this folder on PYTHONPATH).

An NVIDIA GPU whose SM clock is ``standin_clock``'s (cold for the first
``STANDIN_SMI_COLD_READS`` reads, then warm); other figures are fixed.
``amdsmi.py`` here is the same GPU through AMD SMI.
"""

from __future__ import annotations

from typing import Any

from standin_clock import MAX_MHZ, sm_clock

NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0


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
    return sm_clock() if clock == NVML_CLOCK_SM else 2619


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:  # noqa: N802
    return 41


def nvmlDeviceGetPowerUsage(handle: Any) -> int:  # noqa: N802
    return 123_456
