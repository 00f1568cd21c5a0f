"""Gate registrations as krexd verifies them, and the fail-closed check of region entry.

:class:`Verifier` finds the process a registration names among its
tenant's cgroup (or judges it garbage, which drains skip);
:class:`RegionGuard` ends a sibling that has the GPU open without a
verified registration.  docs/design/shim.md "Fail closed".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from krexd.gate import LIVE_REGISTRATION_STATES, Registration, RegistrationInfo
from krexd.system.procfs import read_file, start_time
from krexd.tenancy.tenants import Tenant

#: krex_gate.h KREX_IMAGE_PAGE_MASK: krex_slot.image = start | pages.
_IMAGE_PAGE_MASK = 0xFFF
_PAGE = 4096
_SHIM_NAME = b"libkrex_shim"


@dataclass(frozen=True)
class Identity:
    """A process as its registration would describe it."""

    pid: int  # in krexd's pid namespace
    nspid: int  # in its own (innermost) pid namespace
    pidns: int  # inode of that namespace
    start_ticks: int  # /proc/<pid>/stat field 22
    #: Ticks a registration's start time may differ by: 1 for a process of
    #: another time namespace (the shim takes its boot-time offset back out,
    #: exact only for whole ticks: libkrex_shim/gate/procid.c), else 0.
    start_slack: int = 0


def identity(pid: int) -> Identity | None:
    """Process ``pid``'s identity, or None when it is gone or a zombie with no live thread.

    Liveness and start time come from ``krexd.system.procfs.start_time``: a poll of
    a pidfd held since the process was first seen (its ``stat`` is read only
    then), and a zombie with no thread left is gone.  The namespace half
    (``NSpid``, the namespace inode) is read once per process, keyed by
    (pid, start time), since a process never changes pid namespace.  The
    fail-closed check of every region entry calls this for each sibling
    process on the GPU.
    """
    start = start_time(pid)
    if start is None:
        return None
    try:
        known = _NS_CACHE.get(pid)
        if known is not None and known[0] == start:
            return Identity(pid, known[1], known[2], start, known[3])
        nspid = pid
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    nspid = int(line.split()[-1])
                    break
        pidns = os.stat(f"/proc/{pid}/ns/pid").st_ino
        slack = int(_time_namespace(str(pid)) != _time_namespace("self"))
    except (OSError, IndexError, ValueError):
        return None
    if len(_NS_CACHE) >= _NS_CACHE_MAX:
        _NS_CACHE.clear()  # pids of gone processes: simply start over
    _NS_CACHE[pid] = (start, nspid, pidns, slack)
    return Identity(pid, nspid, pidns, start, slack)


def _time_namespace(pid: str) -> int:
    """Inode of process ``pid``'s time namespace (0 on a kernel without them)."""
    try:
        return os.stat(f"/proc/{pid}/ns/time").st_ino
    except FileNotFoundError:
        return 0


#: pid -> (start ticks, NSpid, pid namespace inode, start slack), for :func:`identity`.
_NS_CACHE: dict[int, tuple[int, int, int, int]] = {}
_NS_CACHE_MAX = 65536


def image_mapped(pid: int, image: int) -> bool:
    """True when the shim mapping recorded as ``image`` is still mapped in ``pid``.

    Read from ``/proc/<pid>/map_files``; for a process whose leader thread
    exited (a zombie leader, other threads running), whose leader's views
    are empty, from a live thread's ``maps`` instead (:func:`_thread_maps`).
    """
    start, pages = image & ~_IMAGE_PAGE_MASK, image & _IMAGE_PAGE_MASK
    if not start or not pages:
        return False
    span = f"{start:x}-{start + pages * _PAGE:x}"
    try:
        return "libkrex_shim" in os.readlink(f"/proc/{pid}/map_files/{span}")
    except OSError:
        pass
    prefix = span.encode() + b" "
    return any(ln.startswith(prefix) and _SHIM_NAME in ln for ln in _thread_maps(pid))


def shim_loaded(pid: int) -> bool:
    """True when some libkrex_shim is mapped in ``pid`` (for the message only)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            if any(_SHIM_NAME in line for line in f):
                return True
    except OSError:
        return False
    return any(_SHIM_NAME in ln for ln in _thread_maps(pid))


def _thread_maps(pid: int) -> list[bytes]:
    """The ``maps`` lines of a live thread of ``pid`` other than the leader (empty if none).

    A leader that called ``exit`` shows empty ``maps`` and ``map_files``; its
    threads still share the whole address space.
    """
    try:
        tids = [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except OSError:
        return []
    for tid in tids:
        try:
            lines = read_file(f"/proc/{pid}/task/{tid}/maps").splitlines()
        except OSError:
            continue  # that thread ended meanwhile
        if lines:
            return lines
    return []


def matches(slot: RegistrationInfo | Registration, who: Identity) -> bool:
    """True when ``slot`` describes process ``who`` (pid, namespace, start time).

    The start time is compared within ``who.start_slack`` ticks (a process
    of another time namespace); a start time of 0 (the shim could not read
    it) matches nothing.
    """
    return (
        slot.pid == who.nspid
        and slot.pidns == who.pidns
        and slot.start_ticks > 0
        and abs(slot.start_ticks - who.start_ticks) <= who.start_slack
    )


class Verifier:
    """Resolves registrations to processes of their tenant's cgroup.

    ``cgroup_pids(tenant_id)`` lists the pids of that tenant's cgroup in
    krexd's namespace, or None for a tenant krexd does not know.
    """

    def __init__(self, cgroup_pids: Callable[[int], list[int] | None]) -> None:
        self._cgroup_pids = cgroup_pids

    def resolve(self, slot: RegistrationInfo) -> int | None:
        """The pid (krexd's namespace) of the live process ``slot`` names, else None."""
        try:
            pids = self._cgroup_pids(slot.tenant)
        except OSError:
            return None
        if not pids:
            return None
        # Most registrations are of krexd's own namespace: try the pid itself first.
        order = ([slot.pid] if slot.pid in pids else []) + [p for p in pids if p != slot.pid]
        for pid in order:
            who = identity(pid)
            if who is not None and matches(slot, who):
                return pid if image_mapped(pid, slot.image) else None
        return None

    def resolve_all(self, slots: list[RegistrationInfo]) -> dict[tuple[int, int], int | None]:
        """(tenant, index) -> the pid each of ``slots`` names, else None: :meth:`resolve` in bulk.

        O(processes + slots) per tenant: each process of a tenant's cgroup is
        read once (:func:`identity`) into a map by (innermost pid, pid
        namespace), which names one live process, then each slot is one
        lookup, the start time's comparison (:func:`matches`) and one check
        of its shim mapping.  What the gate watch's sweep runs on the event
        loop: per (slot, process) it cost about 2 µs, a second per sweep for
        128 forged slots over 4,096 processes.
        """
        by_tenant: dict[int, list[RegistrationInfo]] = {}
        for s in slots:
            by_tenant.setdefault(s.tenant, []).append(s)
        out: dict[tuple[int, int], int | None] = {}
        for tenant, mine in by_tenant.items():
            known = self._identities(tenant)
            for s in mine:
                who = known.get((s.pid, s.pidns))
                ok = who is not None and matches(s, who) and image_mapped(who.pid, s.image)
                out[(s.tenant, s.index)] = who.pid if who is not None and ok else None
        return out

    def _identities(self, tenant: int) -> dict[tuple[int, int], Identity]:
        """(NSpid, pid namespace) -> identity, for the live processes of ``tenant``."""
        try:
            pids = self._cgroup_pids(tenant) or []
        except OSError:
            return {}
        known: dict[tuple[int, int], Identity] = {}
        for pid in pids:
            who = identity(pid)
            if who is not None:
                known.setdefault((who.nspid, who.pidns), who)
        return known

    def judge(self, slot: RegistrationInfo) -> bool:
        """True when ``slot``'s owner is verified live (``krexd.gate.Gate.judge``)."""
        return self.resolve(slot) is not None


@dataclass(frozen=True)
class Unprotected:
    """A sibling process using the GPU without a verified registration."""

    tenant: Tenant
    pid: int
    cause: str

    def describe(self) -> str:
        """One line naming the process, its command and the cause."""
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
        except OSError:
            cmd = "?"
        return (
            f"unprotectable GPU use: pid {self.pid} ({cmd}) of tenant {self.tenant.id} has "
            f"the GPU open but {self.cause}"
        )


def _cause(pid: int, who: Identity, mine: list[Registration], epoch: int) -> str:
    """Why process ``pid`` (``who``) has no verified registration (``epoch``: the region's)."""
    if not shim_loaded(pid):
        return "krex's shim is not loaded in it (LD_PRELOAD unset, or a static program)"
    described = [s for s in mine if matches(s, who)]
    named = [s for s in mine if s.pid == who.nspid and s.pidns == who.pidns]
    if not described and named:
        return (
            f"its registration gives start time {named[0].start_ticks}, not {who.start_ticks} "
            "(its shim could not read its own: docs/design/shim.md, registration in namespaces)"
        )
    if not described:
        return (
            "it never registered with the gate (its shim refused GPU work or was bypassed) "
            f"before epoch {epoch}'s check"
        )
    return "it exec'd another program after it registered"


#: A sibling process without a verified registration: (tenant, pid, identity, its slots).
Suspect = tuple[Tenant, int, Identity, list[Registration]]


class RegionGuard:
    """The fail-closed check of one GPU's region entry (docs/design/shim.md "Fail closed").

    ``users()`` is the set of pids with the GPU open (None: the source
    cannot tell, and the check is skipped, unless ``unknown_is_open``: then
    every unverified sibling process counts as having it open, for GPUs whose
    commands the shim does not gate, where this check is the only guard);
    ``slots()`` the gate's live registrations (``Gate.live_registrations``).
    The check verifies every sibling process first and asks ``users()`` (NVML's process list on a
    real GPU: a driver query of about 0.3-1 ms) only when some process is
    not a verified registrant: the answer is "nothing unprotected" whenever
    every sibling process is one, whoever has the GPU open.
    """

    def __init__(
        self,
        users: Callable[[], set[int] | None],
        slots: Callable[[], list[Registration]],
        unknown_is_open: bool = False,
    ) -> None:
        self._users = users
        self._slots = slots
        self._unknown_is_open = unknown_is_open

    def users(self) -> set[int] | None:
        """The pids with the GPU open now (None: unknown)."""
        return self._users()

    def unprotected(self, siblings: list[Tenant], epoch: int) -> list[Unprotected]:
        """Sibling processes with the GPU open and no verified registration."""
        return self.unprotected_among(self.unverified(siblings), epoch)

    def unprotected_among(self, suspects: list[Suspect], epoch: int) -> list[Unprotected]:
        """Those of ``suspects`` (:meth:`unverified`) that have the GPU open.

        Asks ``users()`` (a driver query on a real GPU) only when there is a
        suspect; none when it cannot tell (None), or all of them with
        ``unknown_is_open`` (the class docstring).
        """
        if not suspects:
            return []
        users = self._users()
        if users is None and self._unknown_is_open:
            unknown = "who has the GPU open cannot be read"
            return [
                Unprotected(t, pid, f"{unknown}; {_cause(pid, who, mine, epoch)}")
                for t, pid, who, mine in suspects
            ]
        if not users:
            return []
        return [
            Unprotected(t, pid, _cause(pid, who, mine, epoch))
            for t, pid, who, mine in suspects
            if pid in users
        ]

    def unverified(self, siblings: list[Tenant]) -> list[Suspect]:
        """Each live sibling process without a verified registration, with its tenant's slots.

        Reads /proc and the slot memories only (no driver call): cheap
        enough to run on krexd's event loop.
        """
        by_tenant: dict[int, list[Registration]] = {}
        for s in self._slots():
            if s.state in LIVE_REGISTRATION_STATES:
                by_tenant.setdefault(s.tenant, []).append(s)
        out: list[Suspect] = []
        for t in siblings:
            try:
                pids = t.cgroup.pids()
            except OSError:
                continue  # the tenant ended
            mine = by_tenant.get(t.id, [])
            for pid in pids:
                who = identity(pid)
                if who is None:
                    continue  # gone: its contexts are torn down
                # A verified registration is enough; its acknowledgement and count
                # are not asked for (docs/design/shim.md "Fail closed": a freeze stops a
                # thread at any instruction, a count of 1 that starts no work included).
                if any(matches(s, who) and image_mapped(pid, s.image) for s in mine):
                    continue
                out.append((t, pid, who, mine))
        return out
