"""The cgroup v2 device controller through bpf(2): a device program per cgroup, from Python.

Assembles krex's program (:func:`program`), loads it, attaches it to a
cgroup directory and lists what is attached, through ``ctypes`` and the raw
syscall: no library beyond libc (none of the Python packages for BPF does
cgroup device programs without a compiler toolchain).  Layouts are those of
``include/uapi/linux/bpf.h``; docs/design/security.md "6. GPU binding".
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence

#: bpf(2) commands, the program type, the attach type and flag (uapi/linux/bpf.h).
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_GET_FD_BY_ID = 13
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2  # access_type's low 16 bits: 1 block, 2 char

#: The NVIDIA driver's character major: ``/dev/nvidia<N>`` is minor N,
#: ``/dev/nvidia-modeset`` 254, ``/dev/nvidiactl`` 255 (the driver's README,
#: "Device nodes"); ``/dev/nvidia-uvm*`` and ``/dev/nvidia-caps/*`` have
#: majors of their own, which the program lets through.
NVIDIA_MAJOR = 195
#: Minors from this one up are the control nodes every GPU user needs.
NVIDIA_SHARED_MINORS = 254
#: The DRM character major (``/dev/dri/*``; fixed in Linux's ``drm_core``).  Render
#: nodes ``/dev/dri/renderD<N>`` are minors :data:`RENDER_MINOR_BASE` and up, one per
#: GPU: an AMD GPU's compute goes through ``/dev/kfd`` (a dynamic major, shared by
#: all GPUs) and that GPU's render node.
DRM_MAJOR = 226
RENDER_MINOR_BASE = 128

#: ``__NR_bpf`` per machine (arch/*/syscall tables).
_SYSCALL = {"x86_64": 321, "aarch64": 280}

#: The license the kernel records with the program (the project's; the
#: kernel requires "GPL" only of programs that call GPL-only helpers).
LICENSE = b"Apache-2.0"
_LOG_SIZE = 1 << 16

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A bpf(2) step failed: ``errno`` is the kernel's, the message names the step
    (and, for a refused load, carries the verifier's log)."""

    def __str__(self) -> str:
        return str(self.strerror)


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char], what: str) -> int:
    """One ``bpf(cmd, attr, sizeof attr)``; the result, or BpfError naming ``what``."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise BpfError(errno.ENOSYS, f"{what}: bpf(2) is not known on {platform.machine()}")
    ret = int(_libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr, len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return ret


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One ``struct bpf_insn``: opcode, dst/src registers (4 bits each), offset, immediate."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


# Opcodes used (BPF_CLASS | BPF_SIZE/OP | BPF_MODE/SRC).
_LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
_AND32_K = 0x54  # BPF_ALU | BPF_AND | BPF_K: dst &= imm (32-bit)
_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K: if dst != imm goto +off
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K (unsigned)
_JLT_K = 0xA5  # BPF_JMP | BPF_JLT | BPF_K (unsigned)
_JA = 0x05  # BPF_JMP | BPF_JA: goto +off
_MOV64_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
_EXIT = 0x95  # BPF_JMP | BPF_EXIT: return r0

#: One step of :func:`program` before assembly (:func:`_assemble`): (kind, a, b, label).
_Step = tuple[str, int, int, str]
ALLOW, DENY, DRM = "allow", "deny", "drm"


def program(
    own_minor: int | None, render_own: int | None = None, render_deny: Sequence[int] = ()
) -> bytes:
    """The device program of a cgroup whose GPU is ``/dev/nvidia<own_minor>`` (or an AMD
    GPU's render node ``/dev/dri/renderD<render_own>``).

    Allows every device that is not an NVIDIA GPU node (not a character
    device of major :data:`NVIDIA_MAJOR`, or a minor from
    :data:`NVIDIA_SHARED_MINORS` up: ``nvidiactl``, ``nvidia-modeset``),
    and the GPU node ``own_minor``; denies every other ``/dev/nvidia<M>``,
    including GPUs krexd does not manage.  ``own_minor`` None denies every
    NVIDIA GPU node (a warm pool's cgroup, an AMD GPU's tenant).

    DRM nodes (major :data:`DRM_MAJOR`; render nodes from minor
    :data:`RENDER_MINOR_BASE` up): ``render_own`` given (an AMD GPU's
    tenant), every one but that render node is denied; else card and
    control nodes and the render nodes of ``render_deny`` (the AMD GPUs
    krexd manages, for an NVIDIA GPU's tenant or a pool); with neither, DRM
    nodes are not looked at, and the program is the one an NVIDIA-only host
    has always had.  ``/dev/kfd`` (another major) is
    always allowed.  Returns the instructions (8 bytes each).

    The kernel runs it with ``struct bpf_cgroup_dev_ctx {__u32 access_type
    /* (BPF_DEVCG_ACC_* << 16) | BPF_DEVCG_DEV_* */; __u32 major; __u32
    minor;}``; it returns 1 (allow) or 0 (``open(2)`` fails with ``EPERM``).
    With ``BPF_F_ALLOW_MULTI`` every program of the cgroup and of its
    ancestors must allow, and a process's children inherit its cgroup.
    """
    drm = render_own is not None or bool(render_deny)
    # r1 = ctx; r2 = the field being tested.
    steps: list[_Step] = [
        ("ld", 0, 0, ""),  # r2 = ctx->access_type
        ("and", 0, 0xFFFF, ""),  # r2 = device type
        ("j", _JNE_K, BPF_DEVCG_DEV_CHAR, ALLOW),  # not a char device
        ("ld", 4, 0, ""),  # r2 = ctx->major
    ]
    if drm:
        steps.append(("j", _JEQ_K, DRM_MAJOR, DRM))
    steps += [
        ("j", _JNE_K, NVIDIA_MAJOR, ALLOW),  # another driver's
        ("ld", 8, 0, ""),  # r2 = ctx->minor
        ("j", _JGE_K, NVIDIA_SHARED_MINORS, ALLOW),  # nvidiactl, nvidia-modeset
    ]
    if own_minor is not None:
        steps.append(("j", _JEQ_K, own_minor, ALLOW))  # its own GPU
    if drm:
        steps += [("ja", 0, 0, DENY), ("label", 0, 0, DRM), ("ld", 8, 0, "")]  # r2 = minor
        # Card (primary) and control nodes, minors below the render nodes': amdgpu's
        # primary node takes the same command submissions as a render node, and the
        # first opener of a card node on a headless host is its DRM master, so they are
        # denied to every tenant and pool of a host with managed AMD GPUs.
        steps.append(("j", _JLT_K, RENDER_MINOR_BASE, DENY))
        if render_own is not None:
            steps.append(("j", _JEQ_K, render_own, ALLOW))  # its own GPU's render node
        else:
            steps += [("j", _JEQ_K, m, DENY) for m in sorted(set(render_deny))]
            steps.append(("ja", 0, 0, ALLOW))
    return _assemble(steps)


def _assemble(steps: list[_Step]) -> bytes:
    """Instructions of ``steps``, then "deny" (return 0) and "allow" (return 1).

    ``("ld", off, 0, "")``: r2 = the ctx field at ``off``; ``("and", 0, mask, "")``:
    r2 &= mask; ``("j", opcode, imm, label)``: a conditional jump on r2 and
    ``imm``; ``("ja", 0, 0, label)``: always; ``("label", 0, 0, name)`` names
    the next instruction.  Jumps are relative to the next instruction.
    """
    labels: dict[str, int] = {}
    n = 0
    for kind, _, _, label in steps:
        if kind == "label":
            labels[label] = n
        else:
            n += 1
    labels[DENY], labels[ALLOW] = n, n + 2
    out: list[bytes] = []
    for kind, a, b, label in (s for s in steps if s[0] != "label"):
        here = len(out) + 1
        if kind == "ld":
            out.append(_insn(_LDX_W, 2, 1, a))
        elif kind == "and":
            out.append(_insn(_AND32_K, 2, 0, 0, b))
        elif kind == "ja":
            out.append(_insn(_JA, 0, 0, labels[label] - here))
        else:
            out.append(_insn(a, 2, 0, labels[label] - here, b))
    out += [_insn(_MOV64_K, 0, 0, 0, 0), _insn(_EXIT)]  # deny: return 0
    out += [_insn(_MOV64_K, 0, 0, 0, 1), _insn(_EXIT)]  # allow: return 1
    return b"".join(out)


def load(
    own_minor: int | None, render_own: int | None = None, render_deny: Sequence[int] = ()
) -> int:
    """Load :func:`program` (arguments as there); returns the program's fd (close it).

    Raises BpfError: ``EPERM`` without CAP_BPF (or CAP_SYS_ADMIN), ``EINVAL``
    on a kernel without the program type; a load the verifier refuses is
    tried again with its log, which the message carries.
    """
    code = program(own_minor, render_own, render_deny)
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(LICENSE)
    try:
        return _bpf(BPF_PROG_LOAD, _load_attr(insns, lic, None), "loading the device program")
    except BpfError as exc:
        if exc.errno not in (errno.EACCES, errno.EINVAL):
            raise
        log = ctypes.create_string_buffer(_LOG_SIZE)
        try:
            return _bpf(BPF_PROG_LOAD, _load_attr(insns, lic, log), "loading the device program")
        except BpfError as again:
            text = log.value.decode(errors="replace").strip()
            raise BpfError(again.errno, f"{again}; verifier log: {text or '(empty)'}") from None


def _load_attr(
    insns: ctypes.Array[ctypes.c_char],
    lic: ctypes.Array[ctypes.c_char],
    log: ctypes.Array[ctypes.c_char] | None,
) -> ctypes.Array[ctypes.c_char]:
    """``union bpf_attr`` for BPF_PROG_LOAD: type, insn_cnt, insns, license, log
    level/size/buffer, kern_version, prog_flags, prog_name."""
    raw = struct.pack(
        "<IIQQIIQII16s",
        BPF_PROG_TYPE_CGROUP_DEVICE,
        len(insns) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(lic),
        1 if log is not None else 0,
        len(log) if log is not None else 0,
        ctypes.addressof(log) if log is not None else 0,
        0,
        0,
        b"krex_devices",
    )
    return ctypes.create_string_buffer(raw, len(raw))


def attach(cgroup_dir: str, prog_fd: int) -> None:
    """Attach program ``prog_fd`` to the cgroup v2 directory ``cgroup_dir`` (multi).

    Raises BpfError (e.g. ``EPERM`` when an ancestor holds a device program
    attached without ``BPF_F_ALLOW_MULTI``), or OSError when the directory
    cannot be opened.

    The caller may close the program's descriptor once it is attached: the
    attachment holds the program, which the kernel detaches and frees when the
    cgroup is removed.
    """
    dfd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        raw = struct.pack("<IIII", dfd, prog_fd, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)
        attr = ctypes.create_string_buffer(raw, len(raw))
        _bpf(BPF_PROG_ATTACH, attr, f"attaching to {cgroup_dir}")
    finally:
        os.close(dfd)


def confine(
    cgroup_dir: str,
    own_minor: int | None,
    render_own: int | None = None,
    render_deny: Sequence[int] = (),
) -> None:
    """Load :func:`program` (arguments as there) and attach it to ``cgroup_dir``.

    The program's fd is closed before returning (the attachment keeps the
    program; removing the cgroup frees both).  Raises BpfError or OSError.
    """
    fd = load(own_minor, render_own, render_deny)
    try:
        attach(cgroup_dir, fd)
    finally:
        os.close(fd)


def attached(cgroup_dir: str, max_ids: int = 64) -> list[int]:
    """Ids of the device programs attached to ``cgroup_dir`` itself (``BPF_PROG_QUERY``).

    Raises BpfError or OSError (no such directory).
    """
    ids = (ctypes.c_uint32 * max_ids)()
    dfd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # target_fd, attach_type, query_flags, attach_flags (out), prog_ids, prog_cnt (in/out)
        raw = struct.pack("<IIIIQI", dfd, BPF_CGROUP_DEVICE, 0, 0, ctypes.addressof(ids), max_ids)
        attr = ctypes.create_string_buffer(raw, len(raw) + 4)
        _bpf(BPF_PROG_QUERY, attr, f"listing the device programs of {cgroup_dir}")
    finally:
        os.close(dfd)
    count = struct.unpack_from("<I", attr.raw, 24)[0]
    return [int(ids[i]) for i in range(min(count, max_ids))]


def program_exists(prog_id: int) -> bool:
    """True while the kernel still holds program ``prog_id`` (``BPF_PROG_GET_FD_BY_ID``).

    Needs CAP_SYS_ADMIN; raises BpfError for any error but ``ENOENT``.
    """
    raw = struct.pack("<III", prog_id, 0, 0)
    try:
        fd = _bpf(BPF_PROG_GET_FD_BY_ID, ctypes.create_string_buffer(raw, len(raw)), "program")
    except BpfError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    os.close(fd)
    return True
