"""The gate's C API: layout constants, the ctypes structures, the loaded library.

The one place that declares C structures for ``libkrex_gate.so``
(``struct krex_slot_info``, ``krex_pending``, ``krex_finding`` of
``libkrex_shim/include/krex_gate.h``) and the prototypes of its functions;
``library()`` loads it once and refuses another layout version.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from krexd.gate.errors import GateError
from krexd.gate.readback import (
    LIVE_REGISTRATION_STATES,
    OOM_REASONS,
    REGISTRATION_STATES,
    FaultSeen,
    OomRecord,
    RegistrationInfo,
)
from krexd.system import paths

#: Layout version this binding was written for (krex_gate.h KREX_GATE_VERSION).
ABI_VERSION = 9
#: Slots of one tenant's slot memory (krex_gate.h KREX_TENANT_SLOTS).
TENANT_SLOTS = 128
#: Tenants one gate can attach (krex_gate.h KREX_GATE_MAX_TENANTS).
MAX_TENANTS = 64
#: The most slots a snapshot can hold.
MAX_SLOTS = TENANT_SLOTS * MAX_TENANTS


class RegistrationInfoC(ctypes.Structure):
    # struct krex_slot_info (krex_gate.h): the flat snapshot, not the atomic slot.
    _fields_ = [
        ("state", ctypes.c_uint32),
        ("inflight", ctypes.c_uint32),
        ("ack_epoch", ctypes.c_uint32),
        ("pid", ctypes.c_int32),
        ("tenant", ctypes.c_uint32),
        ("captures", ctypes.c_uint32),
        ("gated_calls", ctypes.c_uint64),
        ("blocked_calls", ctypes.c_uint64),
        ("last_drain_ns", ctypes.c_uint64),
        ("start_ticks", ctypes.c_uint64),
        ("mem_mib", ctypes.c_uint32),
        ("oom_waited", ctypes.c_uint32),
        ("oom_failed", ctypes.c_uint32),
        ("oom_own", ctypes.c_uint32),
        ("oom_last", ctypes.c_uint32),
        ("oom_waiting", ctypes.c_uint32),
        ("generation", ctypes.c_uint32),
        ("index", ctypes.c_uint32),
        ("owner", ctypes.c_uint64),
        ("image", ctypes.c_uint64),
        ("pidns", ctypes.c_uint64),
        ("claimed_tenant", ctypes.c_uint32),
        ("ignored", ctypes.c_uint32),
        ("fault", ctypes.c_uint32),
        ("reserved_", ctypes.c_uint32),
    ]

    def snapshot(self) -> RegistrationInfo:
        """This C snapshot as a :class:`RegistrationInfo`."""
        oom = _NO_OOM
        if self.oom_waited or self.oom_failed or self.oom_own or self.oom_last or self.oom_waiting:
            oom = OomRecord(
                waited=self.oom_waited,
                failed=self.oom_failed,
                own=self.oom_own,
                last=OOM_REASONS.get(self.oom_last),
                waiting=bool(self.oom_waiting),
            )
        state = REGISTRATION_STATES.get(self.state, f"unknown({self.state})")
        return RegistrationInfo(
            index=self.index,
            state="dead" if self.ignored and state in LIVE_REGISTRATION_STATES else state,
            pid=self.pid,
            tenant=self.tenant,
            inflight=self.inflight,
            ack_epoch=self.ack_epoch,
            captures=self.captures,
            gated_calls=self.gated_calls,
            blocked_calls=self.blocked_calls,
            last_drain_ns=self.last_drain_ns,
            generation=self.generation,
            mem_mib=self.mem_mib,
            oom=oom,
            owner=self.owner,
            start_ticks=self.start_ticks,
            image=self.image,
            pidns=self.pidns,
            claimed_tenant=self.claimed_tenant,
            ignored=bool(self.ignored),
            fault=FaultSeen.decode(self.fault),
        )


class PendingC(ctypes.Structure):
    # struct krex_pending
    _fields_ = [("tenant", ctypes.c_uint32), ("index", ctypes.c_uint32), ("owner", ctypes.c_uint64)]


class FindingC(ctypes.Structure):
    # struct krex_finding
    _fields_ = [
        ("tenant", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("index", ctypes.c_uint32),
        ("value", ctypes.c_uint32),
    ]


_NO_OOM = OomRecord()


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def library() -> ctypes.CDLL:
    """Load libkrex_gate.so once and declare the prototypes."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = paths.gate_library()
        if path is None:
            raise GateError(
                f"{paths.GATE_NAME} not found (build it with `make shim`, or set KREX_GATE_LIB)"
            )
        lib = ctypes.CDLL(path, use_errno=True)
        p, u32, i32, i64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_int64
        u64, cint, cstr = ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p
        u32p = ctypes.POINTER(ctypes.c_uint32)
        protos: dict[str, tuple[Any, list[Any]]] = {
            "krex_gate_abi_version": (u32, []),
            "krex_gate_file_version": (cint, [cstr, u32p]),
            "krex_tenant_mem_size": (u64, []),
            "krex_tenant_mem_header": (cint, [u32, ctypes.c_char_p, u32]),
            "krex_coord_create": (p, [cstr, cstr, u32, u32]),
            "krex_coord_open": (p, [cstr, cstr, u32]),
            "krex_coord_destroy": (None, [p]),
            "krex_coord_fd": (cint, [p]),
            "krex_coord_relink": (cint, [p, cstr, cstr]),
            "krex_coord_attach": (cint, [p, u32, cint]),
            "krex_coord_detach": (cint, [p, u32]),
            "krex_coord_close": (cint, [p, u32, u32]),
            "krex_coord_wait_change": (
                cint,
                [
                    p,
                    u32,
                    u32,
                    u32p,
                    u32,
                    i64,
                    ctypes.POINTER(u64),
                    ctypes.POINTER(PendingC),
                    u32,
                    u32p,
                ],
            ),
            "krex_coord_ignore": (cint, [p, u32, u32, u64]),
            "krex_coord_reopen": (cint, [p, u32, u32]),
            "krex_coord_word": (u64, [p]),
            "krex_coord_epoch": (u32, [p]),
            "krex_coord_set_epoch": (None, [p, u32]),
            "krex_coord_drain_scans": (u64, [p]),
            "krex_coord_slots": (cint, [p, ctypes.POINTER(RegistrationInfoC), u32]),
            "krex_coord_audit": (cint, [p, ctypes.POINTER(FindingC), u32]),
        }
        del i32
        for name, (res, args) in protos.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        version = lib.krex_gate_abi_version()
        if version != ABI_VERSION:
            raise GateError(
                f"{path}: gate layout version {version}, this krexd expects "
                f"{ABI_VERSION} (krexd and {paths.GATE_NAME} come from different builds; "
                "rebuild with `make shim`)"
            )
        _lib = lib
        return lib


def check_id(what: str, value: int) -> None:
    """Raise ValueError unless ``value`` (a tenant, holder or epoch) is in 1..2**32-1."""
    if not isinstance(value, int) or not 0 < value <= 0xFFFF_FFFF:
        raise ValueError(f"{what} must be an integer in 1..2**32-1, not {value!r}")


def registration_memory_spec(tenant: int) -> tuple[int, bytes]:
    """What a launcher needs to create tenant ``tenant``'s slot memory: (size, header).

    The launcher (``krex run``, which does not load this library) creates a
    memfd of exactly ``size`` bytes, writes ``header`` at offset 0, reserves
    the space and seals it against shrinking, growing and further sealing
    (``krex_cli.slotmem``); krexd then attaches it (:meth:`Gate.attach`).
    """
    check_id("tenant", tenant)
    lib = library()
    buf = ctypes.create_string_buffer(256)
    n = int(lib.krex_tenant_mem_header(tenant, buf, len(buf)))
    if n < 0:
        raise GateError(f"slot memory header for tenant {tenant}: {os.strerror(-n)}", -n)
    return int(lib.krex_tenant_mem_size()), buf.raw[:n]
