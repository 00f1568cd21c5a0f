"""AMD GPU inventory: the KFD topology over a fake sysfs tree, HIP through stand-in modules.

No ROCm here: ``tests/amdstub`` holds stand-ins for hip-python's ``hip`` and
for ``amdsmi`` with the call names and return shapes of the real wheels
(their docstrings say which).  krexd runs the HIP inventory in a child
process (``python -m krexd.hardware.hip_probe``), so the tests hand the stand-in to
the child through PYTHONPATH and its devices through ``KREX_TEST_HIP_DEVICES``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from krexd.hardware import hip_probe, inventory, inventory_amd, kfd
from tests.support import REPO

STUBS = str(REPO / "tests" / "amdstub")

#: Two MI300X-like GPUs as HIP lists them (PCI 0000:0c:00 and 0000:22:00).
HIP_DEVICES = [
    {"name": "AMD Instinct MI300X", "mem": 192 << 30, "l2": 4 << 20, "bus": 0x0C,
     "uuid16": "9a1b2c3d4e5f6071", "arch": "gfx942:sramecc+:xnack-"},
    {"name": "AMD Instinct MI300X", "mem": 192 << 30, "l2": 4 << 20, "bus": 0x22,
     "uuid16": "0011223344556677"},
]  # fmt: skip


def write_topology(root: Path, gpus_: list[dict[str, int]]) -> Path:
    """A KFD topology under ``root``: node 0 a CPU, then one node per GPU of ``gpus_``."""
    nodes = root / "topology" / "nodes"
    cpu = nodes / "0"
    cpu.mkdir(parents=True)
    (cpu / "properties").write_text("cpu_cores_count 64\nsimd_count 0\ngpu_id 0\n")
    for n, g in enumerate(gpus_, start=1):
        d = nodes / str(n)
        d.mkdir()
        lines = [f"{k} {v}" for k, v in {"cpu_cores_count": 0, "simd_count": 1216, **g}.items()]
        (d / "properties").write_text("\n".join(lines) + "\nmarketing_name AMD Instinct\n")
    return nodes


KFD_NODES = [
    {"gpu_id": 5001, "unique_id": 0x9A1B2C3D4E5F6071, "drm_render_minor": 128,
     "domain": 0, "location_id": 0x0C << 8},
    {"gpu_id": 5002, "unique_id": 0x0011223344556677, "drm_render_minor": 129,
     "domain": 0, "location_id": 0x22 << 8},
]  # fmt: skip


@pytest.fixture
def amd_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host with two AMD GPUs: /dev/kfd and the topology in tmp_path, no NVIDIA driver."""
    (tmp_path / "kfd").write_text("")
    monkeypatch.setattr(kfd, "KFD_DEVICE", str(tmp_path / "kfd"))
    monkeypatch.setattr(kfd, "TOPOLOGY", str(write_topology(tmp_path, KFD_NODES)))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVIDIA bindings
    monkeypatch.setitem(sys.modules, "cuda", None)
    return tmp_path


@pytest.fixture(autouse=True)
def no_stand_ins_left() -> Iterator[None]:
    """The stand-ins imported by a test are forgotten after it (Python would find them)."""
    yield
    for name in ("hip", "hip.hip", "amdsmi"):
        sys.modules.pop(name, None)


@pytest.fixture
def bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    """hip-python and amdsmi installed: the stand-ins, here and in krexd's HIP child."""
    monkeypatch.syspath_prepend(STUBS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([STUBS, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("KREX_TEST_HIP_DEVICES", json.dumps(HIP_DEVICES))


def test_the_kfd_topology_lists_gpu_nodes_only(tmp_path: Path) -> None:
    nodes = kfd.gpu_nodes(str(write_topology(tmp_path, KFD_NODES)))
    assert [n.node for n in nodes] == [1, 2]  # node 0, the CPU, is no GPU
    assert [n.render_minor for n in nodes] == [128, 129]
    assert nodes[0].uuid == "GPU-9a1b2c3d4e5f6071" and nodes[0].gpu_id == 5001
    assert [n.bdf for n in nodes] == ["0000:0c:00.0", "0000:22:00.0"]
    assert kfd.gpu_nodes(str(tmp_path / "absent")) == []


def test_an_apus_integrated_gpu_is_not_listed(tmp_path: Path) -> None:
    """A node with SIMDs and CPU cores is an APU's integrated GPU: a discrete GPU's host
    with one does not become a host krexd manages AMD GPUs on."""
    apu = {"gpu_id": 7001, "unique_id": 0x77, "drm_render_minor": 128, "cpu_cores_count": 16}
    nodes = kfd.gpu_nodes(str(write_topology(tmp_path, [apu, KFD_NODES[1]])))
    assert [n.gpu_id for n in nodes] == [5002]


def test_without_dev_kfd_there_is_no_amd_gpu(tmp_path: Path) -> None:
    topology = str(write_topology(tmp_path, KFD_NODES))
    assert kfd.amd_gpus_present(str(tmp_path / "no-kfd"), topology) == []
    (tmp_path / "kfd").write_text("")
    assert len(kfd.amd_gpus_present(str(tmp_path / "kfd"), topology)) == 2


def test_the_hip_probe_reads_name_memory_l2_bus_and_uuid(
    bindings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hip import hip  # the stand-in

    got = hip_probe.read_devices(hip)
    assert [d["pci_bus_id"] for d in got] == ["0000:0c:00.0", "0000:22:00.0"]
    assert got[0] == {
        "ordinal": 0,
        "name": "AMD Instinct MI300X",
        "total_mem_bytes": 192 << 30,
        "l2_bytes": 4 << 20,
        "pci_bus_id": "0000:0c:00.0",
        "uuid": "GPU-9a1b2c3d4e5f6071",
        "arch": "gfx942:sramecc+:xnack-",
    }
    monkeypatch.setenv("KREX_TEST_HIP_DEVICES", "[]")
    assert hip_probe.read_devices(hip) == []  # hipErrorNoDevice: none, not an error


def test_two_amd_gpus_are_listed_with_name_uuid_memory_l2_and_render_node(
    amd_host: Path, bindings: None
) -> None:
    found = inventory.discover(0)
    assert [g.index for g in found] == [0, 1]
    assert {g.vendor for g in found} == {"amd"} and not any(g.fake for g in found)
    assert [g.uuid for g in found] == ["GPU-9a1b2c3d4e5f6071", "GPU-0011223344556677"]
    assert [g.name for g in found] == ["AMD Instinct MI300X"] * 2
    assert [(g.total_mem_bytes, g.l2_bytes) for g in found] == [(192 << 30, 4 << 20)] * 2
    assert [g.render_minor for g in found] == [128, 129]
    assert [g.minor for g in found] == [None, None]  # no /dev/nvidia<N>
    assert [g.pci_bus_id for g in found] == ["0000:0c:00.0", "0000:22:00.0"]


def test_without_the_bindings_one_clear_line_and_no_amd_gpu(
    amd_host: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="krexd")
    assert inventory.discover(0) == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "2 AMD GPU(s) found" in lines[0] and "krexd does not manage them" in lines[0]
    assert "hip-python and amdsmi are not installed" in lines[0]
    assert "pip install 'krex[amd]'" in lines[0]


def test_with_hip_but_no_amdsmi_the_line_names_amdsmi(
    amd_host: Path,
    bindings: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi fails
    caplog.set_level(logging.INFO, logger="krexd")
    assert inventory.discover(0) == []
    (line,) = [r.getMessage() for r in caplog.records]
    assert "but amdsmi is not installed" in line and "krex[amd]" in line


def test_a_failing_hip_manages_no_amd_gpu(
    amd_host: Path,
    bindings: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KREX_TEST_HIP_FAIL", "1")
    assert inventory.discover(0) == []
    assert any("hipGetDeviceCount" in r.getMessage() for r in caplog.records)


def test_an_amdsmi_that_cannot_start_manages_no_amd_gpu(
    amd_host: Path,
    bindings: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KREX_TEST_AMDSMI_FAIL", "1")  # installed, but libamd_smi finds no driver
    assert inventory.discover(0) == []
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "amdsmi cannot start" in line and "none managed" in line


def test_an_amd_gpu_without_any_uuid_is_not_managed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices = [{**d, "uuid": ""} for d in hip_probe_like()]
    nodes = kfd.gpu_nodes(str(write_topology(tmp_path, [{**KFD_NODES[0], "unique_id": 0}])))
    assert inventory_amd.match(devices[:1], nodes) == []
    # HIP without a UUID, the KFD node with one: the node's.
    nodes = kfd.gpu_nodes(str(write_topology(tmp_path / "b", KFD_NODES[:1])))
    (d,) = inventory_amd.match(devices[:1], nodes)
    assert d.uuid == "GPU-9a1b2c3d4e5f6071" and d.render_minor == 128


def hip_probe_like() -> list[dict[str, Any]]:
    """What ``krexd.hardware.hip_probe`` prints for :data:`HIP_DEVICES`."""
    return [
        {"ordinal": i, "name": d["name"], "total_mem_bytes": d["mem"], "l2_bytes": d["l2"],
         "pci_bus_id": f"0000:{d['bus']:02x}:00.0", "uuid": f"GPU-{d['uuid16']}", "arch": ""}
        for i, d in enumerate(HIP_DEVICES)
    ]  # fmt: skip


def nvml_two_gpus() -> SimpleNamespace:
    """A stand-in ``pynvml`` with two NVIDIA GPUs (NVML's call names and result shapes)."""
    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 << 30),
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0"),
        nvmlDeviceGetUUID=lambda h: f"GPU-00000000-0000-0000-0000-00000000000{h}",
        nvmlDeviceGetMinorNumber=lambda h: h,
    )


def test_a_mixed_host_numbers_the_amd_gpus_after_the_nvidia_ones(
    amd_host: Path, bindings: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml_two_gpus())
    found = inventory.discover(0)
    assert [(g.index, g.vendor) for g in found] == [
        (0, "nvidia"), (1, "nvidia"), (2, "amd"), (3, "amd"),
    ]  # fmt: skip
    assert len({g.uuid for g in found}) == 4
    assert [g.minor for g in found] == [0, 1, None, None]
    assert [g.render_minor for g in found] == [None, None, 128, 129]


def test_a_host_without_kfd_never_looks_for_the_bindings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kfd, "KFD_DEVICE", str(tmp_path / "no-kfd"))
    monkeypatch.setattr(inventory_amd, "missing_bindings", lambda: pytest.fail("looked"))
    monkeypatch.setattr(inventory_amd, "run_probe", lambda: pytest.fail("probed"))
    assert inventory_amd.discover() == []


def test_fake_gpus_are_nvidia_unless_asked_for_amd() -> None:
    assert [(g.vendor, g.minor, g.render_minor) for g in inventory.discover(2)] == [
        ("nvidia", 0, None), ("nvidia", 1, None),
    ]  # fmt: skip
    amd = inventory.discover(2, "amd")
    assert [(g.vendor, g.minor, g.render_minor) for g in amd] == [
        ("amd", None, 128),
        ("amd", None, 129),
    ]
    assert [g.uuid for g in amd] == [inventory.fake_amd_uuid(0), inventory.fake_amd_uuid(1)]
    assert amd[1].uuid == "GPU-6b72657866616b01" and all(g.fake for g in amd)


def _node(n: int, unique_id: int, render: int | None, bus: int) -> kfd.KfdGpu:
    return kfd.KfdGpu(n, 5000 + n, unique_id, render, 0, bus << 8)


def test_each_kfd_node_serves_one_device_and_one_without_a_render_node_is_not_managed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A device that would share a node, or whose node has no render node, is left out
    (its tenants could not be confined to it)."""
    devices = [
        {"uuid": "", "pci_bus_id": "0000:0c:00.0", "name": "a"},
        {"uuid": "", "pci_bus_id": "0000:0c:00.0", "name": "b"},  # a partition: same bus
        {"uuid": "GPU-0000000000000003", "pci_bus_id": "0000:33:00.0", "name": "c"},
        {"uuid": "GPU-0000000000000004", "pci_bus_id": "0000:44:00.0", "name": "d"},
    ]
    nodes = [_node(1, 1, 128, 0x0C), _node(3, 3, None, 0x33), _node(4, 4, 5, 0x44)]
    with caplog.at_level(logging.WARNING, logger="krexd.gpus"):
        got = inventory_amd.match(devices, nodes)
    assert [(d.name, d.render_minor, d.uuid) for d in got] == [("a", 128, nodes[0].uuid)]
    said = caplog.text
    assert "no KFD node of its own" in said and said.count("no render node") == 2


def _fake_interpreter(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_the_probe_child_runs_from_root_without_the_current_directory_on_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as root, it must import nothing from where krexd was started."""
    report = 'printf \'{"devices": [{"cwd": "%s", "args": "%s"}]}\\n\' "$(pwd)" "$*"\n'
    monkeypatch.setattr(inventory_amd.sys, "executable", _fake_interpreter(tmp_path, report))
    monkeypatch.chdir(tmp_path)
    (got,) = inventory_amd.run_probe(timeout_s=10.0) or [{}]
    assert got["cwd"] == "/" and got["args"].split()[:3] == ["-P", "-m", "krexd.hardware.hip_probe"]


def test_a_probe_that_hangs_is_given_up_in_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import time

    monkeypatch.setattr(
        inventory_amd.sys, "executable", _fake_interpreter(tmp_path, "exec sleep 60\n")
    )
    start = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="krexd.gpus"):
        assert inventory_amd.run_probe(timeout_s=0.5) is None
    assert time.monotonic() - start < 10.0
    assert "did not answer" in caplog.text and "none managed" in caplog.text


def test_amd_gpus_krexd_does_not_manage_are_denied_and_hidden(
    amd_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No amdsmi: both AMD GPUs unmanaged, so every tenant and pool is denied their render
    nodes, and a command on an NVIDIA GPU sees no ROCr GPU (issue 30: never run ungated)."""
    from krex_cli.krexctl import _devices_line
    from krexd.cgroups import bpf, devices
    from krexd.hardware import vendors

    nvidia = inventory.fake_gpus(1)
    assert vendors.unmanaged_render(nvidia) == [128, 129]
    one_managed = [
        *nvidia,
        inventory.GpuInfo(1, "x", 1, 1, None, False, vendor="amd", render_minor=129),
    ]
    assert vendors.unmanaged_render(one_managed) == [128]
    monkeypatch.setattr(kfd, "KFD_DEVICE", str(amd_host / "no-kfd"))
    assert vendors.unmanaged_render(nvidia) == []  # no /dev/kfd: nothing to deny

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(bpf, "confine", lambda *a: calls.append(a))
    iso = devices.DeviceIsolation("auto", {0: 0}, unmanaged_render=[129, 128])
    iso.active = True
    iso.confine_tenant("t0", 0)
    iso.confine_pool("p")
    assert calls == [("t0", 0, None, [128, 129]), ("p", None, None, [128, 129])]
    described = iso.describe()
    assert described["unmanaged_render"] == [128, 129]
    assert "renderD128, renderD129" in _devices_line(described)
    env = vendors.binding(nvidia[0], {"nvidia", "amd"})
    assert env["ROCR_VISIBLE_DEVICES"] == ""
