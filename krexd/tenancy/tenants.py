"""Tenant registry: id, secret token, placed pids, cgroup, and liveness of the launcher.

A tenant is a command admitted to a GPU.  Ids are
decimal integers > 0, never reused within one krexd; tokens are 128-bit
random hex strings.  Every request after ``admit`` carries both; the token
names the tenant, and the kernel-verified caller (``krexd.tenancy.identity``) must be
a process of that tenant or its launcher (docs/design/security.md).

Liveness: krexd watches each tenant's launcher (``krex run``) through a pidfd
(Linux ≥ 5.3), which becomes readable when the process exits, so a launcher
killed with SIGKILL is noticed at once and its slot reclaimed.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from krexd.cgroups import TenantCgroup
from krexd.system.errors import Code, KrexError
from krexd.system.procfs import pid_alive
from krexd.tenancy import states
from krexd.tenancy.memory_records import TenantMemory
from krexd.tenancy.quotas import shown_command

_log = logging.getLogger("krexd.tenants")


@dataclass(eq=False)
class Tenant:
    """One admitted command (fields per docs/design/interfaces.md)."""

    id: int
    token: str
    gpu: int
    argv: list[str]
    launcher_pid: int
    cgroup: TenantCgroup
    exclusive: bool = False
    # Shared, but not a client of its GPU's MPS server (no MPS variables): a suspect of a
    # GPU-wide fault run again, whose own fault then hits nobody else (orchestration/faults.py).
    without_mps: bool = False
    # The verified launcher (krexd.tenancy.identity): its uid and gid, and its start time
    # (field 22 of /proc/<pid>/stat), which binds launcher_pid against pid reuse.
    uid: int = 0
    gid: int = 0
    launcher_start: int = 0
    pids: set[int] = field(default_factory=set)
    state: states.TenantState = states.ADMITTED
    admitted_at: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    signal: int | None = None
    kill_reason: str | None = None  # set when krexd kills the command (e.g. max_region_s)
    told_end: bool = False  # its launcher asked after it once it had ended (krexd's stop)
    kill_code: int | None = None  # the exit code krex run reports for that kill (e.g. 79)
    registrations_attached: bool = False  # its slot memory is attached to its GPU's gate
    slots_fd: int | None = None  # the launcher's fd of that slot memory (adoption re-attaches it)
    # Memory need, usage and out-of-memory record (krexd/memory, docs/design/memory.md).
    memory: TenantMemory = field(default_factory=lambda: TenantMemory(0, "default"))

    def __repr__(self) -> str:
        return f"Tenant(t{self.id}, gpu{self.gpu}, {self.state})"

    def summary(self) -> dict[str, object]:
        """JSON-ready status row (no token)."""
        return {
            "id": self.id,
            "gpu": self.gpu,
            "uid": self.uid,
            "pid": min(self.pids) if self.pids else None,
            "launcher_pid": self.launcher_pid,
            "command": shown_command(self.argv),
            "state": self.state.value,
            "age_s": round(time.monotonic() - self.admitted_at, 3),
            "exclusive": self.exclusive,
            "without_mps": self.without_mps,
            "cgroup": self.cgroup.path,
            "kill_reason": self.kill_reason,
            "memory": self.memory.as_dict(),
        }


class TenantRegistry:
    """All live tenants of one krexd, by id."""

    def __init__(self) -> None:
        self._tenants: dict[int, Tenant] = {}
        self._next_id = 1

    def new_id(self) -> int:
        """Reserve the next tenant id (> 0, never reused)."""
        tid = self._next_id
        self._next_id += 1
        return tid

    @property
    def next_id(self) -> int:
        """The id :meth:`new_id` gives next (saved, so ids are not reused after a restart)."""
        return self._next_id

    def resume_ids(self, next_id: int) -> None:
        """Continue the ids of the krexd before a restart (never lowers the counter)."""
        self._next_id = max(self._next_id, next_id)

    @staticmethod
    def new_token() -> str:
        """A fresh secret token (32 hex digits)."""
        return secrets.token_hex(16)

    def add(self, tenant: Tenant) -> None:
        """Register ``tenant`` (its id must be new)."""
        if tenant.id in self._tenants:
            raise ValueError(f"tenant {tenant.id} already registered")
        self._tenants[tenant.id] = tenant

    def remove(self, tenant: Tenant) -> None:
        """Forget ``tenant`` (no-op when already gone)."""
        self._tenants.pop(tenant.id, None)

    def get(self, tenant_id: int) -> Tenant | None:
        """The live tenant with this id, or None."""
        return self._tenants.get(tenant_id)

    def authenticate(self, tenant_id: int | None, token: str | None) -> Tenant:
        """The tenant ``tenant_id`` if ``token`` is its token; else raise ``KrexError(AUTH)``.

        The comparison is constant-time (``hmac.compare_digest``); an unknown id
        and a wrong token give the same message, so ids cannot be probed.
        """
        if tenant_id is None or token is None:
            raise KrexError(Code.AUTH, "this request needs 'tenant' and 'token'")
        tenant = self._tenants.get(tenant_id)
        expected = tenant.token if tenant is not None else secrets.token_hex(16)
        if not hmac.compare_digest(expected.encode(), token.encode()) or tenant is None:
            raise KrexError(Code.AUTH, f"tenant {tenant_id}: unknown tenant or wrong token")
        return tenant

    def on_gpu(self, gpu: int) -> list[Tenant]:
        """Live tenants of GPU ``gpu``, in admission order."""
        return [t for t in self._tenants.values() if t.gpu == gpu]

    def __iter__(self) -> Iterator[Tenant]:
        return iter(list(self._tenants.values()))

    def __len__(self) -> int:
        return len(self._tenants)


class PidWatch:
    """Calls ``on_exit()`` once, from the event loop, when process ``pid`` ends.

    Uses a pidfd registered with the loop (readable on exit, immune to pid
    reuse); falls back to polling ``/proc`` every ``poll_s`` seconds where
    pidfds are unavailable.  A pid already gone fires at once.
    """

    def __init__(self, pid: int, on_exit: Callable[[], None], poll_s: float = 0.2) -> None:
        self.pid = pid
        self._on_exit = on_exit
        self._fired = False
        self._fd: int | None = None
        self._task: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            loop.call_soon(self._fire)
            return
        except OSError:
            self._task = loop.create_task(self._poll(poll_s))
            return
        loop.add_reader(self._fd, self._fire)

    async def _poll(self, poll_s: float) -> None:
        while pid_alive(self.pid):
            await asyncio.sleep(poll_s)
        self._fire()

    def _fire(self) -> None:
        if self._fired:
            return
        self.cancel()
        self._fired = True
        self._on_exit()

    def cancel(self) -> None:
        """Stop watching (no callback afterwards)."""
        self._fired = True
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._task is not None:
            self._task.cancel()
            self._task = None
