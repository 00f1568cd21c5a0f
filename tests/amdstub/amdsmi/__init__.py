"""Stand-in for the ``amdsmi`` package (PyPI ``amdsmi``, Python over ``libamd_smi``), as far
as krexd uses it; put ``tests/amdstub`` on ``sys.path`` to use it.

The names, arguments and return shapes are those of the amdsmi 7.0.2 wheel
(``amdsmi/amdsmi_interface.py``): ``amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS)``,
``amdsmi_get_processor_handles()`` (a list of handles),
``amdsmi_get_gpu_device_bdf(h)`` (``"0000:c1:00.0"``),
``amdsmi_get_gpu_memory_total(h, AmdSmiMemoryType.VRAM)`` and
``amdsmi_get_gpu_memory_usage(h, AmdSmiMemoryType.VRAM)`` (bytes),
``amdsmi_get_gpu_process_list(h)`` (a list of dicts: ``name``, ``pid``, ``mem``,
``engine_usage``, ``memory_usage`` with ``gtt_mem``/``cpu_mem``/``vram_mem``
in bytes, ``cu_occupancy``), ``amdsmi_shut_down()``; errors raise
``AmdSmiLibraryException`` (an ``AmdSmiException``).

State: :data:`GPUS`, set by the test: a list of ``{"bdf", "total", "used",
"procs": [(pid, vram_bytes)]}``; :data:`CALLS` counts init and shut_down;
:data:`FAIL_INIT` (or ``KREX_TEST_AMDSMI_FAIL``, for a child process) makes
``amdsmi_init`` raise.
"""

from __future__ import annotations

import enum
import os
from typing import Any

GPUS: list[dict[str, Any]] = []
CALLS: dict[str, int] = {"init": 0, "shut_down": 0}
FAIL_INIT = False


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    pass


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    if FAIL_INIT or os.environ.get("KREX_TEST_AMDSMI_FAIL"):
        raise AmdSmiLibraryException("AMDSMI_STATUS_DRIVER_NOT_LOADED")
    CALLS["init"] += 1


def amdsmi_shut_down() -> None:
    CALLS["shut_down"] += 1


def amdsmi_get_processor_handles() -> list[_Handle]:
    return [_Handle(i) for i in range(len(GPUS))]


def amdsmi_get_gpu_device_bdf(processor_handle: _Handle) -> str:
    return str(GPUS[processor_handle.index]["bdf"])


def amdsmi_get_gpu_memory_total(processor_handle: _Handle, mem_type: AmdSmiMemoryType) -> int:
    return int(GPUS[processor_handle.index]["total"])


def amdsmi_get_gpu_memory_usage(processor_handle: _Handle, mem_type: AmdSmiMemoryType) -> int:
    return int(GPUS[processor_handle.index]["used"])


def amdsmi_get_gpu_process_list(processor_handle: _Handle) -> list[dict[str, Any]]:
    return [
        {
            "name": "python3",
            "pid": pid,
            "mem": vram,
            "engine_usage": {"gfx": 0, "enc": 0},
            "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": vram},
            "cu_occupancy": "N/A",
        }
        for pid, vram in GPUS[processor_handle.index].get("procs", [])
    ]
