"""``python -m krexd.hardware.hip_probe``: the AMD GPUs as HIP sees them, one JSON line on stdout.

krexd runs it in a child, never in itself: the HIP runtime would make
krexd a KFD process of every GPU, listed among its users for as long as it
runs (docs/design/amd.md "Inventory").  The line's shape: :func:`read_devices`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

_HEX = set("0123456789abcdefABCDEF")


def _import_hip() -> Any:
    """The ``hip`` bindings module of hip-python (ImportError when absent)."""
    try:
        from hip import hip
    except ImportError:
        from rocm.bindings import hip  # hip-python >= 7.14 without the compat package
    return hip


def _text(value: Any) -> str:
    """A str from what hip-python returns for a C string (str or bytes, NUL-ended)."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value).split("\0", 1)[0].strip()


def _uuid(hip: Any, i: int, props: Any) -> str:
    """``GPU-<16 hex digits>`` of device ``i``, or ""."""
    raw: Any = None
    try:
        err, value = hip.hipDeviceGetUuid(i)
        if int(err) == 0:
            raw = value.bytes
    except Exception:  # an older hip-python without the call
        raw = None
    if raw is None:
        raw = getattr(getattr(props, "uuid", None), "bytes", None)
    if not isinstance(raw, bytes | bytearray):
        return ""
    text = bytes(raw[:16]).decode("ascii", errors="replace")
    return f"GPU-{text.lower()}" if len(text) == 16 and set(text) <= _HEX else ""


def _l2(hip: Any, i: int, props: Any) -> int:
    """Device ``i``'s L2 size: the properties', else ``hipDeviceAttributeL2CacheSize``."""
    l2 = int(getattr(props, "l2CacheSize", 0) or 0)
    if l2 > 0:
        return l2
    try:
        attr = hip.hipDeviceAttribute_t.hipDeviceAttributeL2CacheSize
        err, value = hip.hipDeviceGetAttribute(attr, i)
        return int(value) if int(err) == 0 else 0
    except Exception:
        return 0


def read_devices(hip: Any) -> list[dict[str, Any]]:
    """Every device HIP lists (raises RuntimeError).

    The line: ``{"devices": [{"ordinal", "name", "total_mem_bytes", "l2_bytes",
    "pci_bus_id", "uuid", "arch"}]}``, or ``{"error": str}`` when hip-python
    cannot be imported, HIP fails, or ``amdsmi`` cannot be imported or started
    (``amdsmi_init``): krexd manages no AMD GPU it cannot see into.  ``uuid``
    is ``GPU-<16 characters>`` from ``hipDeviceGetUuid`` (ROCm fills the 16
    bytes with the hex digits of the name ROCr gives the GPU), "" when HIP
    gives none.  ``pci_bus_id`` is built from ``hipDeviceProp_t``'s
    ``pciDomainID``/``pciBusID``/``pciDeviceID`` (function 0: HIP's
    properties carry none).  hip-python's calls each return a tuple whose
    first element is a ``hipError_t`` (0: ``hipSuccess``); newer hip-python is
    ``rocm.bindings.hip`` re-exported as ``hip.hip``, and both are tried.
    """
    err, count = hip.hipGetDeviceCount()
    if int(err) != 0:
        if int(err) == int(hip.hipError_t.hipErrorNoDevice):
            return []
        raise RuntimeError(f"hipGetDeviceCount: {err!s}")
    out = []
    for i in range(int(count)):
        err, props = hip.hipGetDeviceProperties(i)
        if int(err) != 0:
            raise RuntimeError(f"hipGetDeviceProperties({i}): {err!s}")
        dom, bus, dev = (
            int(getattr(props, k, 0) or 0) for k in ("pciDomainID", "pciBusID", "pciDeviceID")
        )
        out.append(
            {
                "ordinal": i,
                "name": _text(props.name),
                "total_mem_bytes": int(props.totalGlobalMem),
                "l2_bytes": _l2(hip, i, props),
                "pci_bus_id": f"{dom:04x}:{bus:02x}:{dev:02x}.0",
                "uuid": _uuid(hip, i, props),
                "arch": _text(getattr(props, "gcnArchName", "")),
            }
        )
    return out


def check_amdsmi() -> str | None:
    """Why amdsmi cannot serve krexd (import, ``amdsmi_init``), or None when it can."""
    try:
        import amdsmi
    except (ImportError, OSError) as exc:  # not installed, or libamd_smi not found
        return f"amdsmi cannot be imported: {exc}"
    try:
        amdsmi.amdsmi_init()
        amdsmi.amdsmi_shut_down()
    except Exception as exc:  # AmdSmiLibraryException: no driver, no permission
        return f"amdsmi cannot start: {type(exc).__name__}: {exc}"
    return None


def main() -> int:
    """Print the JSON line (:func:`read_devices`); always exit 0."""
    try:
        reply: dict[str, Any] = {"devices": read_devices(_import_hip())}
    except ImportError as exc:
        reply = {"error": f"hip-python cannot be imported: {exc}"}
    except Exception as exc:  # a HIP error, a runtime that failed to load
        reply = {"error": f"HIP: {type(exc).__name__}: {exc}"}
    if "devices" in reply:
        why = check_amdsmi()
        if why is not None:
            reply = {"error": why}
    print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
