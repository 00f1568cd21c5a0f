"""The environment binding a command to its GPU, by vendor (hardware/vendors.py, command_env.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from krexd.config.config import Config
from krexd.hardware import vendors
from krexd.hardware.inventory import GpuInfo, fake_gpus
from krexd.orchestration import command_env
from krexd.orchestration.lifecycle import Lifecycle

NV = GpuInfo(0, "NVIDIA H100", 80 << 30, 50 << 20, None, False, "", "GPU-aaaa-nv", 3)
AMD = GpuInfo(1, "AMD Instinct MI300X", 192 << 30, 4 << 20, None, False, "0000:0c:00.0",
              "GPU-9a1b2c3d4e5f6071", None, vendor="amd", render_minor=128)  # fmt: skip


def gpu(info: GpuInfo) -> Any:
    """What command_env reads of a Gpu: its inventory, no gate, no MPS."""
    return SimpleNamespace(info=info, index=info.index, gate=None, gate_path=None, mps=None)


def test_an_nvidia_gpu_on_an_nvidia_host_is_bound_as_before() -> None:
    assert command_env.gpu_binding(gpu(NV)) == {
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa-nv",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "KREX_GPU_UUID": "GPU-aaaa-nv",
    }
    assert command_env.gpu_binding(gpu(NV), {"nvidia"}) == command_env.gpu_binding(gpu(NV))
    no_uuid = GpuInfo(2, "x", 1, 1, None, False)
    assert command_env.gpu_binding(gpu(no_uuid))["CUDA_VISIBLE_DEVICES"] == "2"


def test_an_amd_gpu_is_bound_through_rocr_and_hip_and_cuda_sees_nothing() -> None:
    env = command_env.gpu_binding(gpu(AMD), {"amd"})
    assert env == {
        "ROCR_VISIBLE_DEVICES": "GPU-9a1b2c3d4e5f6071",
        "HIP_VISIBLE_DEVICES": "0",
        "GPU_DEVICE_ORDINAL": "0",
        "CUDA_VISIBLE_DEVICES": "",
        "KREX_GPU_UUID": "GPU-9a1b2c3d4e5f6071",
        "KREX_GPU_VENDOR": "amd",
        "KREX_GPU_PCI": "0000:0c:00.0",
    }
    assert "CUDA_DEVICE_ORDER" not in env


def test_on_a_mixed_host_each_command_is_hidden_the_other_vendors_gpus() -> None:
    both = {"nvidia", "amd"}
    nv = command_env.gpu_binding(gpu(NV), both)
    assert nv["ROCR_VISIBLE_DEVICES"] == "" and nv["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa-nv"
    amd = command_env.gpu_binding(gpu(AMD), both)
    assert amd["CUDA_VISIBLE_DEVICES"] == "" and amd["ROCR_VISIBLE_DEVICES"] == AMD.uuid


def test_the_tenant_environment_carries_the_binding() -> None:
    tenant = SimpleNamespace(id=5, token="tok", gpu=1, exclusive=False, without_mps=False)
    env = command_env.tenant_env(Config(), gpu(AMD), tenant, {"nvidia", "amd"})  # type: ignore[arg-type]
    assert env["KREX_TENANT"] == "5" and env["KREX_GPU"] == "1"
    assert env["ROCR_VISIBLE_DEVICES"] == AMD.uuid and env["HIP_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_a_command_is_hidden_the_amd_gpus_krexd_does_not_manage() -> None:
    """An NVIDIA-only krexd on a host with AMD GPUs it does not manage (no amdsmi)."""
    tenant = SimpleNamespace(id=5, token="tok", gpu=0, exclusive=False, without_mps=False)
    args: list[Any] = [Config(), None, {0: gpu(NV)}, None, None, None, None, None, None]
    plain = Lifecycle(*args).tenant_env(tenant)  # type: ignore[arg-type]
    assert "ROCR_VISIBLE_DEVICES" not in plain  # an NVIDIA-only host: as it always was
    hidden = Lifecycle(*args, frozenset({"amd"})).tenant_env(tenant)  # type: ignore[arg-type]
    assert hidden["ROCR_VISIBLE_DEVICES"] == "" and hidden["CUDA_VISIBLE_DEVICES"] == NV.uuid


def test_simulated_amd_gpus_are_bound_by_their_uuid() -> None:
    info = fake_gpus(2, vendor="amd")[1]
    assert vendors.binding(info)["ROCR_VISIBLE_DEVICES"] == "GPU-6b72657866616b01"


def test_device_minors_by_vendor() -> None:
    assert vendors.device_minors([NV, AMD]) == {"minors": {0: 3}, "render_minors": {1: 128}}
    assert vendors.device_minors(fake_gpus(2)) == {"minors": {0: 0, 1: 1}, "render_minors": {}}


def test_vendor_capabilities() -> None:
    assert vendors.of(NV).mps and vendors.of(NV).driver_lock
    assert not vendors.of(AMD).mps and not vendors.of(AMD).driver_lock
    # no HIP gating yet: the fail-closed check treats "cannot tell" as "has it open"
    assert vendors.of(NV).shim_gated and not vendors.of(AMD).shim_gated
