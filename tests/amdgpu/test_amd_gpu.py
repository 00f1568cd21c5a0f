"""On a real AMD GPU: krexd's inventory, a command's binding and the client's AMD SMI view.

Ready for the first AMD host (docs/design/amd.md): skipped without ``/dev/kfd``
(``amd_gpu``), and with a reason where ``hip-python`` or ``amdsmi`` is missing.
None of this has run on AMD hardware yet.  Each test checks krex's view against
what the HIP runtime or AMD SMI say on their own, in a separate process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from krexd.hardware import inventory_amd, vendors
from krexd.hardware.inventory import GpuInfo
from tests.support import REPO

pytestmark = pytest.mark.amd_gpu

# What the HIP runtime lists in a process of its own (krexd's probe code, read_devices):
# the devices as that process's environment lets it see them.
HIP_LIST = """
import json
from krexd.hardware import hip_probe
print(json.dumps(hip_probe.read_devices(hip_probe._import_hip())))
"""


@pytest.fixture(scope="module")
def devices() -> list[inventory_amd.AmdDevice]:
    missing = inventory_amd.missing_bindings()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install 'krex[amd]'")
    found = inventory_amd.discover()
    assert found, "an AMD GPU is present (/dev/kfd) but krexd's inventory found none"
    return found


def _hip_list(env: dict[str, str]) -> list[dict[str, Any]]:
    env = {**env, "PYTHONPATH": f"{REPO}:{REPO / 'python_client'}"}
    out = subprocess.run(
        [sys.executable, "-c", HIP_LIST], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    listed: list[dict[str, Any]] = json.loads(out.stdout)
    return listed


def test_inventory_lists_every_gpu_hip_lists(devices: list[inventory_amd.AmdDevice]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("VISIBLE_DEVICES")}
    assert len(devices) == len(_hip_list(env))
    for d in devices:
        assert d.uuid.startswith("GPU-") and d.total_mem_bytes > 0 and d.l2_bytes > 0
        assert d.render_minor is not None and os.path.exists(f"/dev/dri/renderD{d.render_minor}")


def test_a_command_bound_to_a_gpu_sees_that_gpu_alone(
    devices: list[inventory_amd.AmdDevice],
) -> None:
    last = devices[-1]
    info = GpuInfo(len(devices) - 1, last.name, last.total_mem_bytes, last.l2_bytes, None,
                   False, last.pci_bus_id, last.uuid, None, vendor="amd",
                   render_minor=last.render_minor)  # fmt: skip
    env = {**os.environ, **vendors.binding(info, {"amd"})}
    (seen,) = _hip_list(env)  # one device, and it is that GPU
    assert seen["pci_bus_id"][:-2] == last.pci_bus_id[:-2]  # the function digit aside
    assert seen["uuid"] in ("", last.uuid)


def test_client_reads_the_bound_gpus_clocks(devices: list[inventory_amd.AmdDevice]) -> None:
    last = devices[-1]
    info = GpuInfo(len(devices) - 1, last.name, last.total_mem_bytes, last.l2_bytes, None,
                   False, last.pci_bus_id, last.uuid, None, vendor="amd",
                   render_minor=last.render_minor)  # fmt: skip
    code = (
        "import json; from krex_client import devicestate as d; s = d.open_state(); "
        "print(json.dumps({'vendor': d.vendor(), 'ok': s.available, 'device': s.device(), "
        "'sample': s.sample()}))"
    )
    env = {**os.environ, **vendors.binding(info, {"amd"}),
           "PYTHONPATH": f"{REPO}:{REPO / 'python_client'}"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["vendor"] == "amd" and got["ok"], got
    assert got["device"]["sm_clock_max_mhz"] and got["sample"]["sm_clock_mhz"] is not None
