"""Who sent a request: the kernel-verified caller, and what it may do to a tenant.

The server reads each request's peer credentials (:func:`caller_from_peer`,
:class:`PeerTable` against a reused pid) into :data:`CALLER`; ops read it
with :func:`caller` and check it by the rules here, each refusal logged and
answered ``AUTH``.  The rules and why: docs/design/security.md "1. Every
request is bound to the kernel-verified caller", "2. Acting on a tenant
needs the token *and* the right process" and "8. Warm pools".
"""

from __future__ import annotations

import contextvars
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from krexd.system.errors import Code, KrexError
from krexd.system.procfs import proc_stat, proc_uids

if TYPE_CHECKING:
    from krexd.tenancy.tenants import Tenant

PoolT = TypeVar("PoolT", covariant=True)


class PoolChildren(Protocol[PoolT]):
    """Which processes are unplaced children of a user's warm pool (``krexd.pools.registry``)."""

    def child_of_pool(self, uid: int, pid: int, ppid: int, start: int) -> PoolT | None:
        """The pool of ``uid`` whose child ``pid`` is (parent ``ppid``, started at ``start``)."""
        ...


_log = logging.getLogger("krexd.identity")

ROOT_UID = 0


@dataclass(frozen=True)
class Caller:
    """A kernel-verified caller: ``pid``, ``uid``, ``gid`` (SO_PEERCRED) and ``start_time``.

    ``start_time`` is field 22 of ``/proc/<pid>/stat`` (clock ticks since
    boot) read when the request arrived; 0 when the process is already gone.
    """

    pid: int
    uid: int
    gid: int
    start_time: int

    @property
    def is_root(self) -> bool:
        """True for uid 0 (trusted with every tenant)."""
        return self.uid == ROOT_UID

    def describe(self) -> str:
        """``pid P uid U`` for log lines and messages."""
        return f"pid {self.pid} uid {self.uid}"


CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("krex_caller", default=None)
"""The caller of the request the current task serves (set by ``krexd.server.server``)."""


def caller() -> Caller:
    """The verified caller of the current request; ``KrexError(AUTH)`` when unknown.

    Fails closed: a transport that gave no peer credentials gets no op that
    needs an identity.
    """
    c = CALLER.get()
    if c is None:
        raise KrexError(Code.AUTH, "krexd could not verify who sent this request")
    return c


def caller_from_peer(peer: str | None) -> Caller | None:
    """Parse libzmq's ``Peer-Address`` of an IPC peer (``localhost:UID:GID:PID``).

    Returns None when the property is missing or malformed (the request then
    runs without a caller and every op needing one answers AUTH).
    """
    if not peer:
        return None
    parts = peer.rsplit(":", 3)
    if len(parts) != 4:
        return None
    try:
        uid, gid, pid = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None
    if pid <= 0 or uid < 0 or gid < 0:
        return None
    stat = proc_stat(pid)
    return Caller(pid, uid, gid, stat[1] if stat is not None else 0)


class PeerTable:
    """Binds each connection (ROUTER routing id) to the caller of its first request.

    The pid in ``SO_PEERCRED`` is the process that connected.  If that process
    exits while a descendant keeps the connection open, the pid may be reused
    by an unrelated process; a later request on the same connection then
    shows a different start time and is answered with no caller (AUTH).
    Remembers at most ``limit`` connections (oldest forgotten first).
    """

    def __init__(self, limit: int = 4096) -> None:
        self._seen: OrderedDict[bytes, Caller] = OrderedDict()
        self._limit = limit

    def resolve(self, routing_id: bytes, peer: str | None) -> Caller | None:
        """The verified caller of a request that came on connection ``routing_id``."""
        c = caller_from_peer(peer)
        if c is None:
            return None
        first = self._seen.get(routing_id)
        if first is None:
            self._seen[routing_id] = c
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)
            return c if c.start_time else None
        self._seen.move_to_end(routing_id)
        if (first.pid, first.start_time) != (c.pid, c.start_time):
            _log.warning(
                "connection of %s now shows start time %d: pid reused; request refused",
                first.describe(),
                c.start_time,
            )
            return None
        return c


# --- rules -----------------------------------------------------------------------------


def refuse(who: Caller, what: str) -> KrexError:
    """Log a refusal with the caller's pid and uid; the ``KrexError(AUTH)`` to raise."""
    _log.warning("refused %s: %s", who.describe(), what)
    return KrexError(Code.AUTH, f"{what} (caller {who.describe()})")


def check_launcher_claim(who: Caller, launcher_pid: int | None) -> None:
    """``admit``: a ``launcher_pid`` in the body must be the caller's own pid."""
    if launcher_pid is not None and launcher_pid != who.pid:
        raise refuse(who, f"admit: launcher_pid {launcher_pid} is not the caller")


def is_launcher(tenant: Tenant, who: Caller) -> bool:
    """True when ``who`` is the tenant's launcher (same pid and start time)."""
    return who.pid == tenant.launcher_pid and who.start_time == tenant.launcher_start


def in_tenant_cgroup(tenant: Tenant, pid: int) -> bool:
    """True when process ``pid`` is listed in the tenant's ``cgroup.procs``."""
    try:
        return pid in tenant.cgroup.pids()
    except OSError:
        return False


def authorize_tenant_op(tenant: Tenant, who: Caller, op: str) -> None:
    """Raise ``KrexError(AUTH)`` unless ``who`` may act on ``tenant`` (security.md §2).

    A stolen ``KREX_TOKEN`` is useless outside the tenant's cgroup: the token
    names the tenant, the kernel names the caller.
    """
    if who.is_root:
        return
    if who.uid != tenant.uid:
        raise refuse(who, f"{op}: tenant {tenant.id} belongs to uid {tenant.uid}")
    if is_launcher(tenant, who) or in_tenant_cgroup(tenant, who.pid):
        return
    raise refuse(who, f"{op}: not a process of tenant {tenant.id} nor its launcher")


def authorize(tenant: Tenant, op: str) -> None:
    """:func:`authorize_tenant_op` for the caller of the current request."""
    authorize_tenant_op(tenant, caller(), op)


def check_placeable(
    tenant: Tenant, pid: int, pools: PoolChildren[PoolT] | None = None
) -> PoolT | None:
    """``place``: ``pid`` must be a direct child of the launcher, with its uid, started after it;
    or an unplaced child of a warm pool of the launcher's uid (then that pool is returned).

    Raises ``KrexError(BAD_FIELD)`` for a process that is gone, and
    ``KrexError(AUTH)`` for anything else (the launcher itself included).
    The uid check compares every uid of the process (real, effective, saved,
    filesystem) with the launcher's, so a set-uid child is refused too.
    """
    stat = proc_stat(pid)
    if stat is None:
        raise KrexError(Code.BAD_FIELD, f"pid {pid} does not exist")
    ppid, start = stat
    owner = Caller(tenant.launcher_pid, tenant.uid, tenant.gid, tenant.launcher_start)
    if pid == tenant.launcher_pid:
        raise refuse(owner, f"place: pid {pid} is the launcher itself, not its child")
    pool = None
    if ppid != tenant.launcher_pid or start < tenant.launcher_start:
        pool = pools.child_of_pool(tenant.uid, pid, ppid, start) if pools is not None else None
        if pool is None:
            raise refuse(
                owner,
                f"place: pid {pid} is not a child of launcher {tenant.launcher_pid} "
                "nor an unplaced child of a warm pool of its uid",
            )
    uids = proc_uids(pid)
    if uids is None or any(u != tenant.uid for u in uids):
        raise refuse(owner, f"place: pid {pid} does not run as the launcher's uid {tenant.uid}")
    return pool


def check_child_of(parent: Caller, pid: int, op: str) -> int:
    """``pid`` must be a direct child of ``parent``, started after it, with its uid (every uid).

    Returns the child's start time; ``KrexError(BAD_FIELD)`` when it is
    gone, ``KrexError(AUTH)`` otherwise.
    """
    stat = proc_stat(pid)
    if stat is None:
        raise KrexError(Code.BAD_FIELD, f"pid {pid} does not exist")
    ppid, start = stat
    if ppid != parent.pid or start < parent.start_time:
        raise refuse(parent, f"{op}: pid {pid} is not a child of the caller")
    uids = proc_uids(pid)
    if uids is None or any(u != parent.uid for u in uids):
        raise refuse(parent, f"{op}: pid {pid} does not run as the caller's uid {parent.uid}")
    return start


def pid_start_time(pid: int) -> int:
    """Start time of ``pid`` (clock ticks since boot), 0 when it is gone."""
    stat = proc_stat(pid)
    return stat[1] if stat is not None else 0
