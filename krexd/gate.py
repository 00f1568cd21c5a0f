"""ctypes binding of ``libkrex_gate.so``: the coordinator's side of the gate.

The gate is one shared-memory file per GPU, written by krexd alone and
mapped read-only by the tenants; each tenant's processes register in the
tenant's own slot memory, a sealed memfd its launcher creates (layout:
``libkrex_shim/include/krex_gate.h``; docs/design/shim.md "Who writes
what").  krexd creates the gate, attaches each tenant's slot memory
(:meth:`Gate.attach`, read-only), and the coordinator drives the region
protocol on it (paper §4.2, DESIGN.md "Region entry and exit"):

* step 2 ``close(holder, epoch)``: one atomic compare-and-swap of the gate
  word; every sibling's next gated driver call parks;
* step 3 ``drain(holder, epoch, timeout_s)``: until every sibling slot has
  acknowledged ``epoch`` with nothing in flight; the owners of slots still
  pending are judged by ``judge`` (krexd's own verification of who the
  slot's process is, ``krexd.registrations``) and those judged gone are
  skipped (:meth:`Gate.ignore`, kept in krexd, never written to the slot);
* step 8 ``reopen(holder, epoch)``: only if the gate still holds that
  region, so a late recovery never reopens a newer one.

:meth:`Gate.audit` validates every attached slot memory (states krexd's
protocol cannot have produced) and publishes the per-tenant memory summary
the shims read; :meth:`Gate.relink` puts the gate file back if its path was
removed or replaced (krexd keeps its fd and a second link).

Opening an existing gate again (krexd after a restart) is not supported by
this layout: a new krexd creates a new gate and tenants must re-attach
(docs/design/shim.md "Restarts").

The protocol code itself is C (``libkrex_shim/gate.c``, ``coord.c``),
shared with the shim; this module only binds it.  ``drain`` blocks in C:
ctypes releases the GIL for the call, so run it in a worker thread
(``asyncio.to_thread``) to keep an event loop responsive.  The layout is
defined once, in the C header; this binding never reads a mapping itself.
(One module, above the usual size, on purpose: it is the only Python code
that knows the gate's C API, and a test keeps it the only one.)

The library is found through ``krexd.paths.gate_library()``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from krexd import paths

#: Layout version this binding was written for (krex_gate.h KREX_GATE_VERSION).
ABI_VERSION = 9
#: Slots of one tenant's slot memory (krex_gate.h KREX_TENANT_SLOTS).
TENANT_SLOTS = 128
#: Tenants one gate can attach (krex_gate.h KREX_GATE_MAX_TENANTS).
MAX_TENANTS = 64
#: The most slots a snapshot can hold.
MAX_SLOTS = TENANT_SLOTS * MAX_TENANTS
#: Mode of the gate file: krexd (root) writes it, everyone may map it read-only.
GATE_MODE = 0o644

SLOT_STATES = {0: "free", 1: "claiming", 2: "active", 3: "dead", 4: "exiting"}
#: States of a slot whose process is registered and alive ("exiting": past its
#: exit synchronization, drained whenever nothing is in flight).
LIVE_SLOT_STATES = ("active", "exiting")

#: enum krex_finding_kind: what krex_coord_audit found that the protocol cannot produce.
FINDINGS = {
    1: "its slot memory's header was rewritten",
    2: "a slot state that does not exist",
    3: "a registration claims another tenant",
    4: "an acknowledgement of an epoch krexd never requested",
    5: "an in-flight count no process can have",
}

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

# The first slice of a drain before pending owners are judged (s), then the
# period of judgements while a drain waits.
_FIRST_JUDGE_S = 0.001
_JUDGE_PERIOD_S = 0.005


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
    """One registration: a tenant process's slot in its tenant's slot memory.

    ``tenant`` is the tenant whose slot memory holds it (krexd's own table,
    not what the slot says: ``claimed_tenant``); ``index`` its place there.
    ``state`` is one of ``free``, ``claiming``, ``active``, ``dead``,
    ``exiting`` (alive, past its exit synchronization; an ``active`` or
    ``exiting`` slot krexd judged gone reads ``dead`` with ``ignored``);
    ``pid`` is in the owner's pid namespace (``pidns``, an inode number),
    ``start_ticks`` its start time and ``image`` the shim's mapping in it
    (krex_gate.h ``krex_slot.image``), which krexd verifies
    (``krexd.registrations``).  ``inflight`` counts driver calls between
    entry and return; ``ack_epoch`` is the last epoch the process drained
    for; ``captures`` its open stream captures; ``gated_calls`` /
    ``blocked_calls`` are counts since it registered; ``last_drain_ns`` is
    the duration of its last drain (ns).  ``mem_mib`` is the device memory
    it allocated through the driver API and has not freed (MiB, rounded up)
    and ``oom`` its out-of-memory record; both stay readable after the
    process ended, until the slot is reused.  ``generation`` counts the
    slot's ownership transitions (mod 2**24) and ``owner`` is the raw
    ownership word.  ``fault`` is the first fatal CUDA error the process
    saw (None: none), kept like the memory record; the tenant writes it, so
    it is a claim (only its defined bits are read), not a fact.
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
    owner: int = 0
    start_ticks: int = 0
    image: int = 0
    pidns: int = 0
    claimed_tenant: int = 0
    ignored: bool = False
    fault: FaultSeen | None = None


@dataclass(frozen=True)
class Finding:
    """A state krexd's protocol cannot have produced, in ``tenant``'s slot memory."""

    tenant: int
    kind: int  # enum krex_finding_kind
    index: int  # slot index (0 for the header)
    value: int  # the offending value

    def describe(self) -> str:
        """In words, naming the slot and the value."""
        what = FINDINGS.get(self.kind, f"finding {self.kind}")
        return f"{what} (slot {self.index}, value {self.value})"


class GateTimeout(GateError):
    """``drain`` ran out of time; ``pending`` lists the undrained registrations."""

    def __init__(self, message: str, pending: list[SlotInfo]) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.pending = pending

    def describe(self) -> str:
        """The pending registrations in words: ``pid 1234 (tenant 5, inflight 1, ack 6)``."""
        parts = [
            f"pid {s.pid} (tenant {s.tenant}, slot {s.index}, inflight {s.inflight}, "
            f"ack {s.ack_epoch})"
            for s in self.pending
        ]
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
        ("index", ctypes.c_uint32),
        ("owner", ctypes.c_uint64),
        ("image", ctypes.c_uint64),
        ("pidns", ctypes.c_uint64),
        ("claimed_tenant", ctypes.c_uint32),
        ("ignored", ctypes.c_uint32),
        ("fault", ctypes.c_uint32),
        ("reserved_", ctypes.c_uint32),
    ]

    def snapshot(self) -> SlotInfo:
        """This C snapshot as a :class:`SlotInfo`."""
        oom = _NO_OOM
        if self.oom_waited or self.oom_failed or self.oom_own or self.oom_last or self.oom_waiting:
            oom = OomRecord(
                waited=self.oom_waited,
                failed=self.oom_failed,
                own=self.oom_own,
                last=OOM_REASONS.get(self.oom_last),
                waiting=bool(self.oom_waiting),
            )
        state = SLOT_STATES.get(self.state, f"unknown({self.state})")
        return SlotInfo(
            index=self.index,
            state="dead" if self.ignored and state in LIVE_SLOT_STATES else state,
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


class _PendingC(ctypes.Structure):
    # struct krex_pending
    _fields_ = [("tenant", ctypes.c_uint32), ("index", ctypes.c_uint32), ("owner", ctypes.c_uint64)]


class _FindingC(ctypes.Structure):
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
            "krex_coord_wait_drained": (
                cint,
                [p, u32, u32, i64, ctypes.POINTER(_PendingC), u32, u32p],
            ),
            "krex_coord_ignore": (cint, [p, u32, u32, u64]),
            "krex_coord_reopen": (cint, [p, u32, u32]),
            "krex_coord_word": (u64, [p]),
            "krex_coord_epoch": (u32, [p]),
            "krex_coord_set_epoch": (None, [p, u32]),
            "krex_coord_slots": (cint, [p, ctypes.POINTER(_SlotInfoC), u32]),
            "krex_coord_audit": (cint, [p, ctypes.POINTER(_FindingC), u32]),
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


def _check_id(what: str, value: int) -> None:
    if not isinstance(value, int) or not 0 < value <= 0xFFFF_FFFF:
        raise ValueError(f"{what} must be an integer in 1..2**32-1, not {value!r}")


def slot_memory_spec(tenant: int) -> tuple[int, bytes]:
    """What a launcher needs to create tenant ``tenant``'s slot memory: (size, header).

    The launcher (``krex run``, which does not load this library) creates a
    memfd of exactly ``size`` bytes, writes ``header`` at offset 0, reserves
    the space and seals it against shrinking, growing and further sealing
    (``krex_cli.slotmem``); krexd then attaches it (:meth:`Gate.attach`).
    """
    _check_id("tenant", tenant)
    lib = _library()
    buf = ctypes.create_string_buffer(256)
    n = int(lib.krex_tenant_mem_header(tenant, buf, len(buf)))
    if n < 0:
        raise GateError(f"slot memory header for tenant {tenant}: {os.strerror(-n)}", -n)
    return int(lib.krex_tenant_mem_size()), buf.raw[:n]


def keep_path(path: str) -> str:
    """The gate's second link for ``path``: ``.krex-keep/<name>`` beside it (root's, 0700)."""
    return os.path.join(os.path.dirname(path), ".krex-keep", os.path.basename(path))


#: Judges one pending registration: True when its owner is verified live (keep waiting).
Judge = Callable[[SlotInfo], bool]


class Gate:
    """One GPU's gate as krexd holds it.  Build with :meth:`create`.

    ``judge`` (optional) verifies the owners of registrations still pending
    in a drain; those it rejects are skipped from then on (:meth:`ignore`).
    """

    def __init__(self, path: str, handle: int, keep: str | None = None) -> None:
        self.path = path
        self.keep = keep
        self.judge: Judge | None = None
        self._h: int | None = handle
        self._lib = _library()
        # Calls in progress (drain runs in worker threads): the mapping is
        # dropped only when the last one returns.
        self._users = 0
        self._unmap_pending = False
        self._mu = threading.Lock()
        self._attached: set[int] = set()  # tenants whose slot memory is attached

    # -- construction -----------------------------------------------------

    @classmethod
    def create(cls, path: str, gpu: int, mode: int = GATE_MODE, keep: str | None = None) -> Gate:
        """Build a fresh, open gate for GPU ``gpu`` at ``path`` and map it.

        ``mode`` is the file mode, applied exactly (the umask is ignored;
        0o644: tenants map it read-only, and the shim refuses a gate that
        is not root's or that others may write).  The file's space is
        reserved before it is used: a full file system raises GateError
        (ENOSPC) here.  It is built beside ``path`` and renamed over it, so
        processes still mapping a previous gate keep their own copy;
        ``keep`` is a second link (in a directory only root writes) from
        which :meth:`relink` restores ``path``.
        """
        if not 0 <= gpu <= 0xFFFF_FFFF:
            raise ValueError(f"gpu must be a GPU index, not {gpu}")
        if mode & ~0o7777:
            raise ValueError(f"mode must be a permission mode, not {oct(mode)}")
        lib = _library()
        h = lib.krex_coord_create(os.fsencode(path), os.fsencode(keep) if keep else None, gpu, mode)
        if not h:
            err = ctypes.get_errno()
            raise GateError(f"cannot create gate {path}: {os.strerror(err)}", err)
        return cls(path, h, keep)

    @classmethod
    def open(cls, path: str, gpu: int | None, keep: str | None = None) -> Gate:
        """Map the gate a krexd made before a restart again, read-write (adoption).

        The tenants' shims keep mapping this very file, so a restarted krexd
        writes the same one (never a new one).  Opened from ``keep`` when it
        exists (a directory only root writes), else ``path``; it must be a
        regular file of krexd's user that nobody else may write, of this
        layout version and for GPU ``gpu`` (None: any, for the watchdog,
        which only reopens it).  No slot memory is attached
        (adoption attaches each tenant's again, :meth:`attach`) and
        :attr:`epoch` is the one the gate word holds (seed it:
        :meth:`set_epoch`).  Raises GateError (EPERM: not a file krexd
        made; EPROTO: another layout version or GPU).
        """
        lib = _library()
        want = 0xFFFF_FFFF if gpu is None else gpu
        h = lib.krex_coord_open(os.fsencode(path), os.fsencode(keep) if keep else None, want)
        if not h:
            err = ctypes.get_errno()
            why = os.strerror(err)
            if err == errno.EPERM:
                why = "not root's, or writable by others: not a gate krexd made"
            elif err == errno.EPROTO:
                version = ctypes.c_uint32(0)
                rc = lib.krex_gate_file_version(os.fsencode(path), ctypes.byref(version))
                why = (
                    f"gate layout version {version.value} (this krexd expects {ABI_VERSION}), "
                    f"or not the gate of GPU {gpu}"
                    if rc == 0
                    else "not a krex gate"
                )
            raise GateError(f"cannot open gate {path}: {why}", err)
        gate = cls(path, h, keep)
        if keep:
            gate.relink()  # `path` names this file again if it was removed or replaced
        return gate

    @contextmanager
    def _mapped(self) -> Iterator[int]:
        """The handle, kept alive for the duration of the block."""
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
            self._lib.krex_coord_destroy(self._h)
            self._h = None

    def unmap(self) -> None:
        """Drop the mappings and fds (the files stay); further calls raise GateError.

        A call still running in another thread keeps them until it returns.
        """
        with self._mu:
            self._unmap_pending = True
            if self._users == 0:
                self._drop()

    def unlink(self) -> None:
        """Remove the gate file (and its second link); the mapping stays usable."""
        for name in (self.path, self.keep):
            if name:
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmap()

    def relink(self) -> bool:
        """Make ``path`` name this gate again if it was removed or replaced.

        Returns True when it had to be restored.  Raises GateError when it
        cannot be (no second link).
        """
        with self._mapped() as h:
            rc = int(
                self._lib.krex_coord_relink(
                    h, os.fsencode(self.path), os.fsencode(self.keep) if self.keep else None
                )
            )
        if rc < 0:
            raise GateError(f"cannot restore gate {self.path}: {os.strerror(-rc)}", -rc)
        return rc == 0

    # -- tenants' slot memory -------------------------------------------------

    def attach(self, tenant: int, fd: int) -> None:
        """Map tenant ``tenant``'s slot memory (read-only) from ``fd``, after checking it.

        ``fd`` is krexd's own open file of the launcher's memfd (the caller
        keeps and closes it).  Raises GateError: EPERM (not a memfd sealed
        against shrinking, growing and sealing), EPROTO (wrong size,
        layout or tenant), EEXIST, ENOSPC (``MAX_TENANTS`` attached).
        """
        _check_id("tenant", tenant)
        with self._mapped() as h:
            rc = int(self._lib.krex_coord_attach(h, tenant, fd))
        if rc == 0:
            with self._mu:
                self._attached.add(tenant)
            return
        if rc != 0:
            why = {
                errno.EPERM: "not a memfd sealed against shrinking, growing and sealing",
                errno.EPROTO: "wrong size, layout or tenant",
            }.get(-rc, os.strerror(-rc))
            raise GateError(f"slot memory of tenant {tenant}: {why}", -rc)

    def detach(self, tenant: int) -> None:
        """Forget tenant ``tenant``'s slot memory (no error if it was not attached)."""
        with self._mapped() as h:
            self._lib.krex_coord_detach(h, tenant)
        with self._mu:
            self._attached.discard(tenant)

    def _capacity(self) -> int:
        """Slots of the attached tenants: the size of a snapshot or pending list."""
        with self._mu:
            return max(1, len(self._attached)) * TENANT_SLOTS

    def ignore(self, slot: SlotInfo) -> None:
        """Skip ``slot`` in drains and summaries while its owner stays ``slot.owner``."""
        with self._mapped() as h:
            self._lib.krex_coord_ignore(h, slot.tenant, slot.index, slot.owner)

    # -- the region protocol ---------------------------------------------

    def close(self, holder: int, epoch: int) -> None:
        """Step 2: close the gate for tenant ``holder`` with a new ``epoch`` (both > 0).

        Raises GateBusy when the gate is not open.
        """
        _check_id("holder", holder)
        _check_id("epoch", epoch)
        with self._mapped() as h:
            rc = self._lib.krex_coord_close(h, holder, epoch)
        if rc == -errno.EBUSY:
            raise GateBusy(f"gate {self.path} is not open (held: {self.word})", errno.EBUSY)
        if rc != 0:
            raise GateError(f"close of gate {self.path}: {os.strerror(-rc)}", -rc)

    def drain(self, holder: int, epoch: int, timeout_s: float) -> None:
        """Step 3: block until every sibling registration acknowledged ``epoch``, idle.

        Siblings are the active and exiting slots of attached tenants other
        than ``holder`` (an exiting one needs no acknowledgement, only nothing
        in flight); owners that :attr:`judge` rejects (gone, exec'd, not the
        tenant's) are skipped.  Raises GateTimeout (with ``pending``) after
        ``timeout_s`` seconds, GateStale if the gate no longer holds
        (holder, epoch).  Blocks without the GIL: call it from a worker
        thread.
        """
        _check_id("holder", holder)
        _check_id("epoch", epoch)
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, not {timeout_s}")
        deadline = time.monotonic() + timeout_s
        slice_s = _FIRST_JUDGE_S
        while True:
            left = max(0.0, deadline - time.monotonic())
            last = left <= slice_s
            pending = self._wait(holder, epoch, left if last else slice_s)
            if pending is None:
                return
            slots = self._pending_slots(pending)
            if self.judge is not None:
                alive = []
                for s in slots:
                    if self.judge(s):
                        alive.append(s)
                    else:
                        self.ignore(s)
                slots = alive
            if last and slots:
                raise GateTimeout(
                    f"gate {self.path}: {len(slots)} registration(s) not drained for "
                    f"epoch {epoch} after {timeout_s:g} s",
                    slots,
                )
            slice_s = _JUDGE_PERIOD_S

    def _wait(self, holder: int, epoch: int, timeout_s: float) -> list[tuple[int, int, int]] | None:
        """One C wait; None when drained, else the pending (tenant, index, owner)."""
        cap = self._capacity()
        pending = (_PendingC * cap)()
        npending = ctypes.c_uint32(0)
        timeout_ns = min(int(timeout_s * 1e9), 2**62)
        with self._mapped() as h:
            rc = self._lib.krex_coord_wait_drained(
                h, holder, epoch, timeout_ns, pending, cap, ctypes.byref(npending)
            )
        if rc == 0:
            return None
        if rc == -errno.ETIMEDOUT:
            return [(p.tenant, p.index, p.owner) for p in pending[: npending.value]]
        if rc == -errno.ESTALE:
            raise GateStale(
                f"gate {self.path} no longer holds tenant {holder} epoch {epoch}", errno.ESTALE
            )
        raise GateError(f"drain on gate {self.path}: {os.strerror(-rc)}", -rc)

    def _pending_slots(self, pending: list[tuple[int, int, int]]) -> list[SlotInfo]:
        """The snapshots of the pending registrations still owned as they were pending."""
        want = set(pending)
        return [s for s in self.slots() if (s.tenant, s.index, s.owner) in want]

    def wait_drained(self, holder: int, epoch: int, timeout_s: float) -> list[SlotInfo]:
        """:meth:`drain`, then the sibling registrations that acknowledged ``epoch``."""
        self.drain(holder, epoch, timeout_s)
        return [
            s
            for s in self.slots()
            if s.state == "active" and s.tenant != holder and s.ack_epoch == epoch
        ]

    def reopen(self, holder: int, epoch: int) -> None:
        """Step 8: reopen the gate if it still holds (holder, epoch).

        Raises GateStale otherwise (a late recovery of an older region).
        """
        _check_id("holder", holder)
        _check_id("epoch", epoch)
        with self._mapped() as h:
            rc = self._lib.krex_coord_reopen(h, holder, epoch)
        if rc == -errno.ESTALE:
            raise GateStale(
                f"gate {self.path} does not hold tenant {holder} epoch {epoch} (held: {self.word})",
                errno.ESTALE,
            )
        if rc != 0:
            raise GateError(f"reopen of gate {self.path}: {os.strerror(-rc)}", -rc)

    # -- audit and status -----------------------------------------------------

    @property
    def epoch(self) -> int:
        """The last epoch krexd requested on this gate (acknowledgements after it are forged)."""
        with self._mapped() as h:
            return int(self._lib.krex_coord_epoch(h))

    def set_epoch(self, epoch: int) -> None:
        """Seed :attr:`epoch` (after a restart: the epochs krexd continues from)."""
        with self._mapped() as h:
            self._lib.krex_coord_set_epoch(h, epoch & 0xFFFF_FFFF)

    def audit(self) -> list[Finding]:
        """Validate every attached slot memory; publish the memory summary; relay frees.

        Returns the states krexd's protocol cannot have produced (the
        caller ends those tenants).  Cheap (no system call unless a tenant
        freed memory): krexd runs it every few ms.
        """
        out = (_FindingC * 64)()
        with self._mapped() as h:
            n = int(self._lib.krex_coord_audit(h, out, len(out)))
        if n < 0:
            raise GateError(f"audit of gate {self.path}: {os.strerror(-n)}", -n)
        return [Finding(f.tenant, f.kind, f.index, f.value) for f in out[:n]]

    @property
    def word(self) -> tuple[int, int] | None:
        """``(holder, epoch)`` while the gate is closed, None while it is open."""
        with self._mapped() as h:
            w = int(self._lib.krex_coord_word(h))
        return None if w == 0 else (w & 0xFFFF_FFFF, w >> 32)

    def slots(self) -> list[SlotInfo]:
        """A snapshot of every used slot of every attached tenant.

        Fields are read without a lock (relaxed loads): counts may be
        mutually stale by a few calls.  Raises GateError once unmapped.
        """
        return [info.snapshot() for info in self._read_slots()]

    def waiting_for_memory(self) -> list[SlotInfo]:
        """The slots whose allocation waits for co-tenants' memory now (``oom.waiting``).

        What admission asks before every decision: only those slots are
        converted.  Raises GateError once unmapped.
        """
        return [info.snapshot() for info in self._read_slots() if info.oom_waiting]

    def _read_slots(self) -> list[_SlotInfoC]:
        cap = self._capacity()
        infos = (_SlotInfoC * cap)()
        with self._mapped() as h:
            n = int(self._lib.krex_coord_slots(h, infos, cap))
        if n < 0:
            raise GateError(f"slots of gate {self.path}: {os.strerror(-n)}", -n)
        return list(infos[:n])
