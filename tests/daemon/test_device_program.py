"""The device program's instructions and the status line, without root (the kernel's
verdicts are in test_device_isolation.py)."""

from __future__ import annotations

import struct

from krex_cli.krexctl import _devices_line
from krexd.cgroups import bpf


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
