"""The device program's instructions and the status line, without root (the kernel's
verdicts are in test_device_isolation.py)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from krex_cli.krexctl import _devices_line
from krexd.cgroups import bpf, devices


def decode(code: bytes) -> list[tuple[int, int, int, int, int]]:
    """(opcode, dst, src, off, imm) per instruction."""
    out = []
    for i in range(0, len(code), 8):
        op, regs, off, imm = struct.unpack_from("<BBhi", code, i)
        out.append((op, regs & 0xF, regs >> 4, off, imm))
    return out


def test_every_jump_lands_on_allow_and_only_the_own_minor_is_let_through() -> None:
    for own, length in ((3, 12), (None, 11)):
        insns = decode(bpf.program(own))
        assert len(insns) == length
        allow = length - 2
        assert insns[allow] == (0xB7, 0, 0, 0, 1) and insns[-1][0] == 0x95  # return 1
        assert insns[allow - 2] == (0xB7, 0, 0, 0, 0)  # return 0: the only deny
        jumps = [(i, ins) for i, ins in enumerate(insns) if ins[0] in (0x15, 0x35, 0x55)]
        assert all(i + 1 + ins[3] == allow for i, ins in jumps)
        tested = {(ins[0], ins[4]) for _, ins in jumps}
        assert (0x55, bpf.BPF_DEVCG_DEV_CHAR) in tested and (0x55, bpf.NVIDIA_MAJOR) in tested
        assert (0x35, bpf.NVIDIA_SHARED_MINORS) in tested
        assert ((0x15, own) in tested) == (own is not None)


def test_status_line_says_whether_isolation_is_active() -> None:
    active = {"mode": "auto", "active": True, "reason": "", "minors": {"0": 0, "1": 3}}
    assert _devices_line(active) == (
        "device isolation: active (each tenant may open only its own GPU: "
        "gpu0 -> /dev/nvidia0, gpu1 -> /dev/nvidia3)"
    )
    off = {"mode": "off", "active": False, "reason": "[gpu] device_isolation = off"}
    assert _devices_line(off) == "device isolation: off ([gpu] device_isolation = off)"
    no_bpf = {"mode": "auto", "active": False, "reason": "loading: Operation not permitted"}
    assert "inactive (loading: Operation not permitted)" in _devices_line(no_bpf)


def verdict(code: bytes, major: int, minor: int, dev_type: int = bpf.BPF_DEVCG_DEV_CHAR) -> int:
    """What the kernel would return for an open of (``dev_type``, ``major``, ``minor``):
    the program run by a small interpreter of the opcodes it uses."""
    ctx = {0: (1 << 16) | dev_type, 4: major, 8: minor}  # access_type, major, minor
    insns = decode(code)
    regs = [0] * 11
    pc = 0
    while True:
        op, dst, src, off, imm = insns[pc]
        pc += 1
        if op == 0x61:  # r_dst = *(u32 *)(r_src + off), r_src the context
            assert src == 1
            regs[dst] = ctx[off]
        elif op == 0x54:
            regs[dst] &= imm
        elif op == 0xB7:
            regs[dst] = imm
        elif op == 0x95:
            return regs[0]
        elif op == 0x05:
            pc += off
        else:
            taken = {0x55: regs[dst] != imm, 0x15: regs[dst] == imm,
                     0x35: regs[dst] >= imm, 0xA5: regs[dst] < imm}[op]  # fmt: skip
            pc += off if taken else 0


NV, DRM = bpf.NVIDIA_MAJOR, bpf.DRM_MAJOR
KFD = 511  # /dev/kfd has a dynamic major of its own


def test_an_amd_tenant_opens_its_render_node_and_kfd_only() -> None:
    code = bpf.program(None, render_own=129)
    assert verdict(code, DRM, 129) == 1 and verdict(code, KFD, 0) == 1
    assert verdict(code, DRM, 128) == 0 and verdict(code, DRM, 130) == 0
    # /dev/dri/card0 and control nodes: amdgpu takes command submissions there too
    assert (
        verdict(code, DRM, 0) == 0 and verdict(code, DRM, 64) == 0 and verdict(code, DRM, 127) == 0
    )
    assert verdict(code, NV, 0) == 0 and verdict(code, NV, 255) == 1  # nvidiactl stays
    assert verdict(code, 1, 3) == 1 and verdict(code, DRM, 128, dev_type=1) == 1


def test_on_a_mixed_host_nvidia_tenants_and_pools_are_denied_the_amd_render_nodes() -> None:
    tenant = bpf.program(0, render_deny=[129, 128])
    assert verdict(tenant, NV, 0) == 1 and verdict(tenant, NV, 1) == 0
    assert verdict(tenant, DRM, 128) == 0 and verdict(tenant, DRM, 129) == 0
    assert verdict(tenant, DRM, 130) == 1 and verdict(tenant, KFD, 0) == 1
    assert verdict(tenant, DRM, 0) == 0  # a card node reaches the AMD GPUs too
    pool = bpf.program(None, render_deny=[128])
    assert verdict(pool, DRM, 1) == 0
    assert verdict(pool, NV, 0) == 0 and verdict(pool, DRM, 128) == 0
    assert verdict(pool, DRM, 129) == 1 and verdict(pool, NV, 254) == 1


def test_an_nvidia_only_program_never_looks_at_drm_nodes() -> None:
    code = bpf.program(3)
    assert verdict(code, NV, 3) == 1 and verdict(code, NV, 2) == 0
    assert verdict(code, DRM, 128) == 1 and verdict(code, KFD, 0) == 1
    assert DRM not in {ins[4] for ins in decode(code)}


def test_isolation_gives_each_gpu_its_vendors_program(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(bpf, "confine", lambda *a: calls.append(a))
    iso = devices.DeviceIsolation("auto", {0: 4}, {1: 128, 2: 129})
    iso.active = True
    iso.confine_tenant("t0", 0)
    iso.confine_tenant("t1", 1)
    iso.confine_pool("p")
    assert calls == [
        ("t0", 4, None, [128, 129]),
        ("t1", None, 128, ()),
        ("p", None, None, [128, 129]),
    ]
    assert iso.describe()["render_minors"] == {"1": 128, "2": 129}
    assert "render_minors" not in devices.DeviceIsolation("auto", {0: 0}).describe()
    unknown = devices.DeviceIsolation("auto", {}, {1: None})
    unknown.probe("/nonexistent")
    assert not unknown.active and "gpu1" in unknown.reason


def test_status_line_names_the_render_nodes_of_amd_gpus() -> None:
    active = {"mode": "auto", "active": True, "reason": "", "minors": {"0": 0},
              "render_minors": {"1": 128}}  # fmt: skip
    assert _devices_line(active).endswith("gpu0 -> /dev/nvidia0, gpu1 -> /dev/dri/renderD128)")
