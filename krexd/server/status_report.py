"""krexd's reports of itself: the ``ping`` and ``status`` bodies, the STATUS= line, problems.

Read from the parts the daemon built (:class:`Reported`, which
``krexd.daemon.Daemon`` satisfies); nothing here changes them.
"""

from __future__ import annotations

from typing import Any, Protocol

from krexd.cgroups import CgroupBackend
from krexd.config.config import Config
from krexd.memory.status import MemoryStatus
from krexd.orchestration.faults import FaultMonitor
from krexd.orchestration.gpu import Gpu
from krexd.pools.registry import PoolRegistry
from krexd.restarts.counters import DaemonCounters
from krexd.server.server import Server
from krexd.system.runtime import Runtime
from krexd.tenancy.admission import Admission
from krexd.tenancy.tenants import TenantRegistry


class Reported(Protocol):
    """The daemon's parts a report reads (None: not built yet, or a failed start)."""

    config: Config
    version: str
    pid: int
    runtime: Runtime
    tenants: TenantRegistry
    faults: FaultMonitor | None
    server: Server | None
    counters: DaemonCounters

    @property
    def gpus(self) -> dict[int, Gpu]:
        """One record per managed GPU."""
        ...

    @property
    def cgroups(self) -> CgroupBackend | None:
        """The cgroup tree."""
        ...

    @property
    def admission(self) -> Admission:
        """Admission over every GPU's slots."""
        ...

    @property
    def memory(self) -> MemoryStatus | None:
        """GPU memory as status reports it."""
        ...

    @property
    def pools(self) -> PoolRegistry | None:
        """The warm pools' registry."""
        ...

    @property
    def metrics(self) -> HasStatus | None:
        """The metrics endpoint (None: ``[metrics]`` off)."""
        ...


class HasStatus(Protocol):
    """A part with a JSON-ready ``status()`` (the metrics endpoint)."""

    def status(self) -> dict[str, Any]:
        """Its status."""
        ...


def summary_line(d: Reported) -> str:
    """One line for STATUS= and the log."""
    used = sum(g.slots.used for g in d.gpus.values())
    total = sum(g.slots.total for g in d.gpus.values())
    line = (
        f"{len(d.gpus)} GPU(s), {len(d.tenants)} tenant(s), slots {used}/{total}, "
        f"{len(d.admission.parked)} parked"
    )
    found = problems(d)
    if found:
        line += "; unhealthy: " + "; ".join(f"{k}: {v}" for k, v in found.items())
    return line


def problems(d: Reported) -> dict[str, str]:
    """What is wrong now, by part (empty: healthy); shown by status and STATUS=."""
    return dict(d.cgroups.problems) if d.cgroups is not None else {}


def about(d: Reported) -> dict[str, Any]:
    """The ``ping`` op's reply body: version, pid, uptime (s), ``krex run``'s retry default."""
    return {
        "version": d.version,
        "pid": d.pid,
        "uptime_s": d.runtime.uptime_s(),
        "retry_tempfail": d.config.memory.retry_tempfail,
        "warm": d.config.warm.announce(),
        "cache": d.config.cache.announce(),
    }


def status(d: Reported) -> dict[str, Any]:
    """The ``status`` op's reply body (docs/design/interfaces.md "Control plane")."""
    gpus_out = []
    for gpu in d.gpus.values():
        row = gpu.status([t.id for t in d.tenants.on_gpu(gpu.index)])
        row["memory"] = d.memory.gpu_status(gpu.index) if d.memory else None
        gpus_out.append(row)
    return {
        **about(d),
        "state": d.runtime.state.value,
        "healthy": not problems(d),
        "problems": problems(d),
        "socket": d.config.daemon.socket,
        "config": d.config.source,
        "cgroups": d.cgroups.describe() if d.cgroups is not None else None,
        "gpus": gpus_out,
        "tenants": [t.summary() for t in d.tenants],
        "queue": d.admission.status(),
        "connections": (
            d.server.guard.status() if d.server is not None and d.server.guard is not None else None
        ),
        "memory": d.memory.settings() if d.memory else None,
        "faults": d.faults.status() if d.faults else None,
        "warm": d.pools.status() if d.pools is not None else None,
        "server": d.server.status() if d.server is not None else None,
        "daemon": d.counters.as_dict(),
        "metrics": d.metrics.status() if d.metrics is not None else None,
    }
