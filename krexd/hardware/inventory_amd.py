"""AMD GPU inventory (ROCm): the KFD topology first, then HIP (hip-python) in a child process.

A host without AMD GPUs never imports a ROCm binding, and one with them
says once what is missing; the checks, in order: docs/design/amd.md
"Inventory".  The devices come back in HIP's order; ``krexd.hardware.inventory``
numbers them after the NVIDIA GPUs.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from krexd.hardware import kfd

_log = logging.getLogger("krexd.gpus")

#: What to install for AMD GPUs (the ``amd`` extra of pyproject.toml).
INSTALL_HINT = "pip install 'krex[amd]' (hip-python and amdsmi)"
#: The modules the two bindings provide.
BINDINGS = {"hip": "hip-python", "amdsmi": "amdsmi"}
#: How long the HIP child may take (the runtime's start on a loaded host).
PROBE_TIMEOUT_S = 60.0
#: Variables that would filter the child's view of the GPUs (HIP also reads
#: CUDA_VISIBLE_DEVICES when HIP_VISIBLE_DEVICES is empty).
_VISIBILITY = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
               "GPU_DEVICE_ORDINAL")  # fmt: skip


@dataclass(frozen=True)
class AmdDevice:
    """One AMD GPU of the inventory (``krexd.hardware.inventory`` makes its ``GpuInfo``)."""

    name: str
    total_mem_bytes: int
    l2_bytes: int
    pci_bus_id: str
    uuid: str
    render_minor: int | None


def missing_bindings() -> list[str]:
    """The distributions of :data:`BINDINGS` whose module Python cannot find."""
    missing = []
    for module, dist in BINDINGS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(dist)
    return missing


def run_probe(timeout_s: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]] | None:
    """The devices ``python -m krexd.hardware.hip_probe`` lists; None (logged) when it fails.

    The child runs as krexd (root), so it imports nothing from where krexd was
    started: working directory ``/`` and ``-P`` (no script or current directory
    on ``sys.path``).  A child that does not answer within ``timeout_s`` is
    killed and waited for at most 5 s more (one stuck in the driver, which no
    signal ends at once, is left behind rather than stalling krexd's start).
    """
    env = {k: v for k, v in os.environ.items() if k not in _VISIBILITY}
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # krexd/
    here = os.path.dirname(pkg)  # krexd's parent
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    try:
        child = subprocess.Popen(
            [sys.executable, "-P", "-m", "krexd.hardware.hip_probe"],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        _log.error("AMD GPUs: the HIP inventory could not start (%s): none managed", exc)
        return None
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        try:
            child.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass  # stuck in the driver: left to exit when it can
        _log.error("AMD GPUs: the HIP inventory did not answer in %.0f s: none managed", timeout_s)
        return None
    try:
        reply = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (stderr or stdout).strip()[-300:]
        _log.error(
            "AMD GPUs: the HIP inventory failed (%s): none managed", tail or child.returncode
        )
        return None
    if "error" in reply:
        _log.error("AMD GPUs: %s: none managed", reply["error"])
        return None
    devices: list[dict[str, Any]] = reply.get("devices") or []
    return devices


def match(devices: list[dict[str, Any]], nodes: list[kfd.KfdGpu]) -> list[AmdDevice]:
    """``devices`` (the probe's: ``uuid``, ``pci_bus_id``, ``name``, ``total_mem_bytes``,
    ``l2_bytes``) with what their KFD nodes add (docs/design/amd.md "Inventory", step 4).

    Each KFD node serves one device at most.  A device without a node of its own, or
    whose node gives no render node (``drm_render_minor`` under 128 or unknown), is not
    managed: its tenants could not be confined to it, and one such GPU would otherwise
    turn device isolation off for the whole host (``krexd.cgroups.devices``).
    """
    out = []
    free = list(nodes)
    for d in devices:
        uuid = str(d.get("uuid") or "")
        bdf = str(d.get("pci_bus_id") or "")
        by_uuid = [n for n in free if uuid and n.uuid == uuid]
        by_bus = [n for n in free if kfd.bus_device(n.bdf) == kfd.bus_device(bdf)]
        node = by_uuid[0] if by_uuid else (by_bus[0] if len(by_bus) == 1 else None)
        if node is None or node.render_minor is None or node.render_minor < 128:
            why = "no KFD node of its own" if node is None else "no render node"
            _log.warning("AMD GPU %s (%s): %s: not managed", uuid or "?", bdf, why)
            continue
        free.remove(node)
        uuid = uuid or node.uuid
        if not uuid:
            # Commands are bound to an AMD GPU by UUID (ROCR_VISIBLE_DEVICES): none, no binding.
            _log.warning("AMD GPU at %s: neither HIP nor KFD gives a UUID: not managed", bdf)
            continue
        out.append(
            AmdDevice(
                name=str(d.get("name") or "AMD GPU"),
                total_mem_bytes=int(d.get("total_mem_bytes") or 0),
                l2_bytes=int(d.get("l2_bytes") or 0),
                pci_bus_id=node.bdf,
                uuid=uuid,
                render_minor=node.render_minor,
            )
        )
    return out


def discover() -> list[AmdDevice]:
    """The AMD GPUs krexd manages on this host (the steps of docs/design/amd.md "Inventory")."""
    nodes = kfd.amd_gpus_present()
    if not nodes:
        return []
    missing = missing_bindings()
    if missing:
        _log.warning(
            "%d AMD GPU(s) found (%s) but %s not installed: krexd does not manage them; "
            "install with %s",
            len(nodes),
            kfd.KFD_DEVICE,
            " and ".join(missing) + (" is" if len(missing) == 1 else " are"),
            INSTALL_HINT,
        )
        return []
    devices = run_probe()
    if devices is None:
        return []
    if len(devices) != len(nodes):
        _log.warning("AMD GPUs: HIP lists %d, the KFD topology %d", len(devices), len(nodes))
    return match(devices, nodes)
