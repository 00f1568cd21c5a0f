"""``status``: everything ``krexctl status`` shows.

Request body: ``{}``.  No credentials needed.
Reply body (stable keys; ``krexctl status --json`` prints it as is)::

    {"version": str, "pid": int, "uptime_s": float, "state": "starting|running|stopping",
     "healthy": bool, "problems": {str: str},
     "socket": str, "config": str,
     "cgroups": {"backend": "v2|hybrid", "cpuset": "v2|v1|affinity", "root": str,
                 "cpuset_root": str|null, "systemd": bool, "problems": {str: str}},
     "connections": {"open": int, "peak": int, "max": int, "refused": int}|null,
     "gpus": [{"index": int, "name": str, "fake": bool, "total_mem_bytes": int,
               "slice": {"cores": "0-7", "reserved": "7", "tenant_cores": "0-6",
                         "shared": bool},
               "slots_used": int, "slots_total": int, "exclusive": bool,
               "tenants": [int], "gate": str|null,
               "holder": int|null, "region": {...}|null,
               "memory": {"source": "nvml|fake|shim", "total_bytes", "used_bytes",
                          "free_bytes", "tenants_bytes", "other_bytes", "reserved_bytes",
                          "headroom_bytes", "available_bytes": int|null,
                          "waiting": [int], "blocked": bool}|null}],
     "tenants": [{"id", "gpu", "pid", "launcher_pid", "command", "state", "age_s",
                  "exclusive", "cgroup", "kill_reason",
                  "memory": {"need_bytes", "need_source", "used_bytes", "peak_bytes",
                             "used_source", "exceeded", "oom_waited", "oom_cotenant",
                             "oom_own", "last_oom", "last_cotenant_oom", "waiting",
                             "outcome"}}],
     "queue": {"parked": int, "queue": [...], "granted_total": int, "parked_total": int,
               "max_bypass": int},
     "memory": {"admission": bool, "default_need_bytes", "headroom_bytes", "max_bypass",
                "oom_wait_s", "refresh_ms", "source"}}

``region`` is the coordinator's own ``status()``: holder, queue, counts and
latency percentiles (ms) ``entry_ms`` (request to grant, as in the
``region_enter`` reply), ``wait_ms`` (for the region lock) and
``establish_ms`` (steps 2-5).  ``memory`` per GPU
is ``krexd.memory.MemoryMonitor.gpu_status`` (``waiting``: tenants whose
allocation waits for co-tenants' memory; ``blocked``: admission to the GPU
is stopped meanwhile); a parked request's row has ``mem_bytes``,
``waiting_for`` ("slot" or "memory"), ``mem_gpu`` and ``bypassed``.
Errors: ``BAD_FIELD``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Collect krexd's status (see module docstring)."""
    fields.only(req.body)
    return ctx.status()
