"""Stand-in for hip-python's ``hip.hip`` module (``rocm.bindings.hip``), as far as krexd uses it.

The names and return shapes are those of the hip-python 10.0.0.0.1.2 /
rocm-bindings-hip 10.0.0.0.1.2 wheels (their ``hip.pyi`` stubs and ``hip.pyx``):
every call returns a tuple whose first element is a ``hipError_t`` (an
``IntEnum``; ``hipSuccess`` 0, ``hipErrorNoDevice`` 100, ``hipErrorInvalidDevice``
101, as HIP's headers number them); ``hipDeviceProp_t.name`` and
``gcnArchName`` read as ``str``; ``hipUUID_t.bytes`` is the 16 bytes of the
field (ROCm fills them with the hex digits of ROCr's ``GPU-<16 hex>`` name).

The simulated devices come from ``KREX_TEST_HIP_DEVICES`` (JSON list of
``{"name", "mem", "l2", "domain", "bus", "device", "uuid16", "arch"}``), read on
every call, so a test sets it for krexd's HIP child process too;
``KREX_TEST_HIP_FAIL=1`` makes ``hipGetDeviceCount`` fail.
"""

from __future__ import annotations

import enum
import json
import os
from typing import Any


class hipError_t(enum.IntEnum):  # noqa: N801 - hip-python's name
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorNoDevice = 100
    hipErrorInvalidDevice = 101


class hipDeviceAttribute_t(enum.IntEnum):  # noqa: N801
    hipDeviceAttributeL2CacheSize = 42


class hipUUID_t:  # noqa: N801
    def __init__(self, raw: bytes) -> None:
        self.bytes = raw[:16].ljust(16, b"\0")


class hipDeviceProp_t:  # noqa: N801
    def __init__(self, d: dict[str, Any]) -> None:
        self.name = d.get("name", "AMD Instinct MI300X")
        self.totalGlobalMem = int(d.get("mem", 192 << 30))
        self.l2CacheSize = int(d.get("l2", 4 << 20))
        self.pciDomainID = int(d.get("domain", 0))
        self.pciBusID = int(d.get("bus", 0))
        self.pciDeviceID = int(d.get("device", 0))
        self.gcnArchName = d.get("arch", "gfx942:sramecc+:xnack-")
        self.uuid = hipUUID_t(str(d.get("uuid16", "")).encode())


def _devices() -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = json.loads(os.environ.get("KREX_TEST_HIP_DEVICES", "[]"))
    return devices


def hipGetDeviceCount() -> tuple[hipError_t, int]:  # noqa: N802
    if os.environ.get("KREX_TEST_HIP_FAIL"):
        return hipError_t.hipErrorInvalidValue, 0
    n = len(_devices())
    return (hipError_t.hipSuccess if n else hipError_t.hipErrorNoDevice), n


def hipGetDeviceProperties(deviceId: int) -> tuple[hipError_t, hipDeviceProp_t | None]:  # noqa: N802, N803
    devices = _devices()
    if not 0 <= deviceId < len(devices):
        return hipError_t.hipErrorInvalidDevice, None
    return hipError_t.hipSuccess, hipDeviceProp_t(devices[deviceId])


def hipDeviceGetUuid(device: int) -> tuple[hipError_t, hipUUID_t | None]:  # noqa: N802
    err, props = hipGetDeviceProperties(device)
    return err, (props.uuid if props is not None else None)


def hipDeviceGetAttribute(attr: hipDeviceAttribute_t, deviceId: int) -> tuple[hipError_t, int]:  # noqa: N802, N803
    err, props = hipGetDeviceProperties(deviceId)
    if props is None or attr != hipDeviceAttribute_t.hipDeviceAttributeL2CacheSize:
        return hipError_t.hipErrorInvalidValue, 0
    return err, props.l2CacheSize
