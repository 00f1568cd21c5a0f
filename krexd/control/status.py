"""``status``: everything ``krexctl status`` shows.

Request body: ``{}``.  No credentials needed.
Reply body (stable keys; ``krexctl status --json`` prints it as is)::

    {"version": str, "pid": int, "uptime_s": float, "state": "starting|running|stopping",
     "socket": str, "config": str,
     "cgroups": {"backend": "v2|hybrid", "cpuset": "v2|v1|affinity", "root": str,
                 "cpuset_root": str|null, "systemd": bool},
     "gpus": [{"index": int, "name": str, "fake": bool, "total_mem_bytes": int,
               "slice": {"cores": "0-7", "reserved": "7", "tenant_cores": "0-6",
                         "shared": bool},
               "slots_used": int, "slots_total": int, "exclusive": bool,
               "tenants": [int], "gate": str|null,
               "holder": int|null, "region": {...}|null}],
     "tenants": [{"id", "gpu", "pid", "launcher_pid", "command", "state", "age_s",
                  "exclusive", "cgroup"}],
     "queue": {"parked": int, "queue": [...], "granted_total": int, "parked_total": int}}

``region`` is the coordinator's own ``status()`` (holder, queue, counts,
entry-latency percentiles) when one runs for that GPU.
Errors: ``BAD_FIELD``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields

if TYPE_CHECKING:
    from krexd.daemon import Daemon


async def handle(daemon: Daemon, req: Request) -> dict[str, Any]:
    """Collect the daemon's status (see module docstring)."""
    fields.only(req.body)
    return daemon.status()
