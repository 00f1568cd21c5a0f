"""ctypes binding of ``libkrex_gate.so``: the coordinator's side of the gate.

The gate is one shared-memory file per GPU (layout: ``libkrex_shim/include/
krex_gate.h``).  krexd creates it, and the coordinator drives the region
protocol on it (paper §4.2, DESIGN.md "Region entry and exit"):

* step 2 ``close(holder, epoch)``: one atomic compare-and-swap of the gate
  word; every sibling's next gated driver call parks;
* step 3 ``wait_drained(holder, epoch, timeout_s)``: until every sibling
  slot has acknowledged ``epoch`` with nothing in flight;
* step 8 ``reopen(holder, epoch)``: only if the gate still holds that
  region, so a late recovery never reopens a newer one.

The protocol code itself is C (``libkrex_shim/gate.c``), shared with the
shim; this module only binds it.  ``wait_drained`` blocks in C: ctypes
releases the GIL for the call, so run it in a worker thread
(``asyncio.to_thread``) to keep an event loop responsive.

The layout is defined once, in the C header; this binding never reads the
mapping itself: the slots' device-memory fields and out-of-memory record
(``libkrex_shim/memory.c``, docs/design/memory.md) come decoded through
``krex_gate_slots_info`` like every other field.  One :class:`Gate` per
gate file per process: krexd's memory monitor reads the coordinator's.
(One module, above the usual size, on purpose: it is the only Python code
that knows the gate's C API, and a test keeps it the only one.)

The library is found through ``krexd.paths.gate_library()``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from krexd import paths

#: Layout version this binding was written for (krex_gate.h KREX_GATE_VERSION).
ABI_VERSION = 6
#: Slots a gate can hold (krex_gate.h KREX_GATE_MAX_SLOTS).
MAX_SLOTS = 256

SLOT_STATES = {0: "free", 1: "claiming", 2: "active", 3: "dead", 4: "exiting"}
#: States of a slot whose process is registered and alive ("exiting": past its
#: exit synchronization, drained whenever nothing is in flight).
LIVE_SLOT_STATES = ("active", "exiting")

#: enum krex_oom_reason, by value: the last out-of-memory error the shim handed back.
OOM_REASONS: dict[int, str | None] = {
    0: None,
    1: "timeout",  # co-tenants: waited oom_wait_s, not enough was freed
    2: "in_region",  # co-tenants: the tenant held the region (siblings frozen)
    3: "nested",  # co-tenants: inside another driver call, could not wait
    4: "no_wait",  # co-tenants: waiting is off ([memory] oom_wait_s = 0)
    5: "too_large",  # own: the tenant alone would exceed the card
    6: "alone",  # own: no co-tenant process on the GPU
    7: "mutual",  # co-tenants: all of them waited too; the latest admitted gave up
}
#: The reasons that blame co-tenants (``krex run`` exits 75 on them).
COTENANT_REASONS = frozenset({"timeout", "in_region", "nested", "no_wait", "mutual"})


class GateError(Exception):
    """A gate operation failed (bad file, wrong version, refused transition)."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


class GateBusy(GateError):
    """``close`` on a gate that is not open (another region holds it)."""


class GateStale(GateError):
    """The gate no longer holds the (holder, epoch) the caller named."""


@dataclass(frozen=True)
class OomRecord:
    """A slot's out-of-memory record (counts since the process registered; saturating)."""

    waited: int = 0  # co-tenant OOMs absorbed: waited, then the allocation succeeded
    failed: int = 0  # co-tenant OOMs returned to the program
    own: int = 0  # OOMs returned as the tenant's own
    last: str | None = None  # reason of the last one returned (OOM_REASONS)
    waiting: bool = False  # an allocation waits for co-tenants' memory now


#: krex_gate.h KREX_FAULT_*: a slot's record of the first fatal CUDA error its process saw.
_FAULT_CODE_MASK, _FAULT_LAUNCHED, _FAULT_AT_SYNC = 0xFFFF, 0x10000, 0x20000


@dataclass(frozen=True)
class FaultSeen:
    """The first fatal ("sticky") CUDA error a process saw (libkrex_shim/fault.c).

    ``code`` is the CUresult (700: illegal address); ``launched``: the
    process had launched kernels before it; ``at_sync``: the shim's own
    synchronization (a drain, the exit) found it, no call of the program.
    """

    code: int
    launched: bool
    at_sync: bool

    @classmethod
    def decode(cls, word: int) -> FaultSeen | None:
        """The record of slot word ``word`` (None when no fatal error was seen)."""
        if not word & _FAULT_CODE_MASK:
            return None
        return cls(
            word & _FAULT_CODE_MASK, bool(word & _FAULT_LAUNCHED), bool(word & _FAULT_AT_SYNC)
        )


@dataclass(frozen=True)
class SlotInfo:
    """One slot of the gate: a registered tenant process.

    ``state`` is one of ``free``, ``claiming``, ``active``, ``dead``,
    ``exiting`` (alive, past its exit synchronization);
    ``inflight`` counts driver calls between entry and return; ``ack_epoch``
    is the last epoch the process drained for; ``captures`` its open stream
    captures; ``gated_calls`` / ``blocked_calls`` are counts since it
    registered; ``last_drain_ns`` is the duration of its last drain (ns).
    ``mem_mib`` is the device memory it allocated through the driver API and
    has not freed (MiB, rounded up) and ``oom`` its out-of-memory record;
    both stay readable after the process ended, until the slot is reused.
    ``generation`` counts the slot's ownership transitions (mod 2**24,
    krex_gate.h ``krex_slot.owner``).  ``fault`` is the first fatal CUDA
    error the process saw (None: none), kept like the memory record.
    """

    index: int
    state: str
    pid: int
    tenant: int
    inflight: int
    ack_epoch: int
    captures: int
    gated_calls: int
    blocked_calls: int
    last_drain_ns: int
    mem_mib: int = 0
    oom: OomRecord = OomRecord()
    generation: int = 0
    fault: FaultSeen | None = None


class GateTimeout(GateError):
    """``wait_drained`` ran out of time; ``pending`` lists the undrained slots."""

    def __init__(self, message: str, pending: list[int], slots: list[SlotInfo]) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.pending = pending
        self.slots = slots

    def describe(self) -> str:
        """The pending slots in words: ``slot 3 (pid 1234, tenant 5, inflight 1, ack 6)``."""
        by_index = {s.index: s for s in self.slots}
        parts = []
        for i in self.pending:
            s = by_index.get(i)
            if s is None:
                parts.append(f"slot {i}")
            else:
                parts.append(
                    f"slot {i} (pid {s.pid}, tenant {s.tenant}, "
                    f"inflight {s.inflight}, ack {s.ack_epoch})"
                )
        return ", ".join(parts) or "none"


class _SlotInfoC(ctypes.Structure):
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
        ("fault", ctypes.c_uint32),
    ]

    def snapshot(self, index: int) -> SlotInfo:
        """This C snapshot as a :class:`SlotInfo` of slot ``index``."""
        oom = _NO_OOM
        if self.oom_waited or self.oom_failed or self.oom_own or self.oom_last or self.oom_waiting:
            oom = OomRecord(
                waited=self.oom_waited,
                failed=self.oom_failed,
                own=self.oom_own,
                last=OOM_REASONS.get(self.oom_last),
                waiting=bool(self.oom_waiting),
            )
        return SlotInfo(
            index=index,
            state=SLOT_STATES.get(self.state, f"unknown({self.state})"),
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
            fault=FaultSeen.decode(self.fault) if self.fault else None,
        )


_NO_OOM = OomRecord()


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def _library() -> ctypes.CDLL:
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
        u32p = ctypes.POINTER(ctypes.c_uint32)
        protos: dict[str, tuple[Any, list[Any]]] = {
            "krex_gate_open": (p, [ctypes.c_char_p, ctypes.c_int, u32, u32, u32]),
            "krex_gate_unmap": (None, [p]),
            "krex_gate_abi_version": (u32, []),
            "krex_gate_load_word": (ctypes.c_uint64, [p]),
            "krex_gate_slot_info": (ctypes.c_int, [p, u32, ctypes.POINTER(_SlotInfoC)]),
            "krex_gate_slots_info": (ctypes.c_int, [p, ctypes.POINTER(_SlotInfoC), u32]),
            "krex_gate_file_version": (ctypes.c_int, [ctypes.c_char_p, u32p]),
            "krex_gate_close": (ctypes.c_int, [p, u32, u32]),
            "krex_gate_wait_drained": (ctypes.c_int, [p, u32, u32, i64, u32p, u32p]),
            "krex_gate_reopen": (ctypes.c_int, [p, u32, u32]),
            "krex_gate_reclaim_dead": (ctypes.c_int, [p]),
            "krex_gate_forget_pid": (ctypes.c_int, [p, i32]),
        }
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


def _check_id(what: str, value: int) -> None:
    if not isinstance(value, int) or not 0 < value <= 0xFFFF_FFFF:
        raise ValueError(f"{what} must be an integer in 1..2**32-1, not {value!r}")


class Gate:
    """One mapped gate file.  Build with :meth:`create` or :meth:`open`."""

    def __init__(self, path: str, handle: int) -> None:
        self.path = path
        self._h: int | None = handle
        self._lib = _library()
        # Calls in progress (wait_drained runs in worker threads): the
        # mapping is dropped only when the last one returns.
        self._users = 0
        self._unmap_pending = False
        self._mu = threading.Lock()

    # -- construction -----------------------------------------------------

    @classmethod
    def create(cls, path: str, gpu: int, nslots: int = MAX_SLOTS, mode: int = 0o666) -> Gate:
        """Build a fresh, open gate for GPU ``gpu`` at ``path`` and map it.

        ``nslots`` (1..256) bounds the tenant processes that can register;
        ``mode`` is the file mode, applied exactly (the umask is ignored;
        tenants map the file read-write, hence 0o666 by default).  The file
        is built beside ``path`` and renamed over it, so processes still
        mapping a previous gate keep their own copy.
        """
        if not 0 < nslots <= MAX_SLOTS:
            raise ValueError(f"nslots must be in 1..{MAX_SLOTS}, not {nslots}")
        if not 0 <= gpu <= 0xFFFF_FFFF:
            raise ValueError(f"gpu must be a GPU index, not {gpu}")
        if mode & ~0o7777:
            raise ValueError(f"mode must be a permission mode, not {oct(mode)}")
        lib = _library()
        h = lib.krex_gate_open(os.fsencode(path), 1, gpu, nslots, mode)
        if not h:
            err = ctypes.get_errno()
            raise GateError(f"cannot create gate {path}: {os.strerror(err)}", err)
        return cls(path, h)

    @classmethod
    def open(cls, path: str) -> Gate:
        """Map an existing gate file (checks magic and layout version)."""
        lib = _library()
        h = lib.krex_gate_open(os.fsencode(path), 0, 0, 0, 0)
        if not h:
            err = ctypes.get_errno()
            why = os.strerror(err)
            if err == errno.EPROTO:
                version = ctypes.c_uint32(0)
                rc = lib.krex_gate_file_version(os.fsencode(path), ctypes.byref(version))
                why = (
                    f"gate layout version {version.value}, this krexd expects {ABI_VERSION} "
                    "(the file was made by another build)"
                    if rc == 0
                    else "not a krex gate"
                )
            raise GateError(f"cannot open gate {path}: {why}", err)
        return cls(path, h)

    @contextmanager
    def _mapped(self) -> Iterator[int]:
        """The mapping's address, kept mapped for the duration of the block."""
        with self._mu:
            if self._h is None or self._unmap_pending:
                raise GateError(f"gate {self.path} is unmapped")
            self._users += 1
            h = self._h
        try:
            yield h
        finally:
            with self._mu:
                self._users -= 1
                if self._unmap_pending and self._users == 0:
                    self._drop()

    def _drop(self) -> None:
        if self._h is not None:
            self._lib.krex_gate_unmap(self._h)
            self._h = None

    def unmap(self) -> None:
        """Drop the mapping (the file stays); further calls raise GateError.

        A call still running in another thread keeps the mapping until it
        returns.
        """
        with self._mu:
            self._unmap_pending = True
            if self._users == 0:
                self._drop()

    def unlink(self) -> None:
        """Remove the gate file; the mapping stays usable until :meth:`unmap`."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmap()

    # -- the region protocol ---------------------------------------------

    def close(self, holder: int, epoch: int) -> None:
        """Step 2: close the gate for tenant ``holder`` with a new ``epoch`` (both > 0).

        Raises GateBusy when the gate is not open.
        """
        _check_id("holder", holder)
        _check_id("epoch", epoch)
        with self._mapped() as h:
            rc = self._lib.krex_gate_close(h, holder, epoch)
        if rc == -errno.EBUSY:
            raise GateBusy(f"gate {self.path} is not open (held: {self.word})", errno.EBUSY)
        if rc != 0:
            raise GateError(f"close of gate {self.path}: {os.strerror(-rc)}", -rc)

    def drain(self, holder: int, epoch: int, timeout_s: float) -> None:
        """Step 3: block until every sibling slot acknowledged ``epoch``, idle.

        Siblings are the ACTIVE and EXITING slots of tenants other than
        ``holder`` (an EXITING one needs no acknowledgement, only nothing
        in flight); slots whose process died are marked dead and skipped.  Raises
        GateTimeout (with ``pending``, the undrained slot indices) after
        ``timeout_s`` seconds, GateStale if the gate no longer holds
        (holder, epoch).  Blocks without the GIL: call it from a worker
        thread.  The coordinator's path: nothing is read back afterwards.
        """
        _check_id("holder", holder)
        _check_id("epoch", epoch)
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, not {timeout_s}")
        pending = (ctypes.c_uint32 * MAX_SLOTS)()
        npending = ctypes.c_uint32(0)
        timeout_ns = min(int(timeout_s * 1e9), 2**62)
        with self._mapped() as h:
            rc = self._lib.krex_gate_wait_drained(
                h, holder, epoch, timeout_ns, pending, ctypes.byref(npending)
            )
        if rc == -errno.ETIMEDOUT:
            idx = [int(pending[i]) for i in range(npending.value)]
            raise GateTimeout(
                f"gate {self.path}: {len(idx)} slot(s) not drained for "
                f"epoch {epoch} after {timeout_s:g} s",
                idx,
                self.slots(),
            )
        if rc == -errno.ESTALE:
            raise GateStale(
                f"gate {self.path} no longer holds tenant {holder} epoch {epoch}", errno.ESTALE
            )
        if rc != 0:
            raise GateError(f"drain on gate {self.path}: {os.strerror(-rc)}", -rc)

    def wait_drained(self, holder: int, epoch: int, timeout_s: float) -> list[int]:
        """:meth:`drain`, then the indices of the sibling slots that acknowledged ``epoch``.

        Reading the slots back copies every slot: use :meth:`drain` where
        the list is not needed.
        """
        self.drain(holder, epoch, timeout_s)
        return [
            s.index
            for s in self.slots()
            if s.state == "active" and s.tenant != holder and s.ack_epoch == epoch
        ]

    def reopen(self, holder: int, epoch: int) -> None:
        """Step 8: reopen the gate if it still holds (holder, epoch); frees dead slots.

        Raises GateStale otherwise (a late recovery of an older region).
        """
        _check_id("holder", holder)
        _check_id("epoch", epoch)
        with self._mapped() as h:
            rc = self._lib.krex_gate_reopen(h, holder, epoch)
        if rc == -errno.ESTALE:
            raise GateStale(
                f"gate {self.path} does not hold tenant {holder} epoch {epoch} (held: {self.word})",
                errno.ESTALE,
            )
        if rc != 0:
            raise GateError(f"reopen of gate {self.path}: {os.strerror(-rc)}", -rc)

    def reclaim_dead(self) -> int:
        """Free the slots of processes that no longer exist (gone, zombie, pid reused).

        While the gate is closed they are marked dead instead and freed at
        reopen.  Returns how many were reclaimed.
        """
        with self._mapped() as h:
            rc = int(self._lib.krex_gate_reclaim_dead(h))
        if rc < 0:
            raise GateError(f"reclaim on gate {self.path}: {os.strerror(-rc)}", -rc)
        return rc

    # -- status ------------------------------------------------------------

    @property
    def word(self) -> tuple[int, int] | None:
        """``(holder, epoch)`` while the gate is closed, None while it is open."""
        with self._mapped() as h:
            w = int(self._lib.krex_gate_load_word(h))
        return None if w == 0 else (w & 0xFFFF_FFFF, w >> 32)

    def slots(self) -> list[SlotInfo]:
        """A snapshot of every slot below the gate's ``nslots``, free ones included.

        Fields are read without a lock (one C call, relaxed loads): counts
        may be mutually stale by a few calls.  Raises GateError once unmapped.
        """
        infos = self._read_slots()
        return [info.snapshot(i) for i, info in enumerate(infos)]

    def waiting_for_memory(self) -> list[SlotInfo]:
        """The slots whose allocation waits for co-tenants' memory now (``oom.waiting``).

        What admission asks before every decision: only those slots are
        converted.  Raises GateError once unmapped.
        """
        infos = self._read_slots()
        return [info.snapshot(i) for i, info in enumerate(infos) if info.oom_waiting]

    def _read_slots(self) -> list[_SlotInfoC]:
        infos = (_SlotInfoC * MAX_SLOTS)()
        with self._mapped() as h:
            n = int(self._lib.krex_gate_slots_info(h, infos, MAX_SLOTS))
        if n < 0:
            raise GateError(f"slots of gate {self.path}: {os.strerror(-n)}", -n)
        return list(infos[:n])
