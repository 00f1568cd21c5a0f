"""``status``: everything ``krexctl status`` shows.

Request body: ``{}``.  No tenant credentials needed; what is shown depends
on the kernel-verified caller (need-to-know, below).
Reply body (stable keys; ``krexctl status --json`` prints it as is)::

    {"version": str, "pid": int, "uptime_s": float, "state": "starting|running|stopping",
     "healthy": bool, "problems": {str: str},
     "socket": str, "config": str,
     "cgroups": {"backend": "v2|hybrid", "cpuset": "v2|v1|affinity", "root": str,
                 "cpuset_root": str|null, "systemd": bool, "problems": {str: str},
                 "pids": "v2|v1|none", "pids_root": str|null, "pids_max": int|null,
                 "devices": {"mode": "auto|require|off", "active": bool, "reason": str,
                             "minors": {str: int|null},
                             "render_minors": {str: int|null} (AMD GPUs only)}},
     "connections": {"open": int, "peak": int, "max": int, "max_per_uid": int,
                     "refused": int, "idle_s": float, "idle_closed": int,
                     "per_s_per_uid": float, "burst_per_uid": int, "paced": int,
                     "refused_rate": int}|null,
     "gpus": [{"index": int, "name": str, "vendor": "nvidia|amd", "fake": bool,
               "total_mem_bytes": int,
               "slice": {"cores": "0-7", "reserved": "7", "tenant_cores": "0-6",
                         "shared": bool},
               "slots_used": int, "slots_total": int, "exclusive": bool,
               "slots": {"total": int, "mode": "auto|fixed", "rule": str},
               "tenants": [int], "gate": str|null,
               "gate_word": {"holder": int, "epoch": int}|null,  (null: open, or no gate)
               "holder": int|null, "region": {...}|null,
               "memory": {"source": "nvml|amdsmi|fake|shim", "total_bytes", "used_bytes",
                          "free_bytes", "tenants_bytes", "other_bytes", "reserved_bytes",
                          "headroom_bytes", "available_bytes": int|null,
                          "waiting": [int], "blocked": bool}|null}],
     "tenants": [{"id", "gpu", "uid", "pid", "launcher_pid", "command", "state", "age_s",
                  "exclusive", "without_mps", "cgroup", "kill_reason",
                  "memory": {"need_bytes", "need_source", "used_bytes", "peak_bytes",
                             "used_source", "label", "declared_bytes", "learned_bytes",
                             "shim_peak_bytes", "exceeded", "oom_waited", "oom_cotenant",
                             "oom_own", "last_oom", "last_cotenant_oom", "waiting",
                             "outcome"}}],
     "queue": {"parked": int, "queue": [...], "granted_total": int, "parked_total": int,
               "max_bypass": int},
     "memory": {"admission": bool, "default_need_bytes", "headroom_bytes", "max_bypass",
                "oom_wait_s", "refresh_ms", "source", "learn",
                "learned": {"labels", "max_labels", "max_per_uid", "path"}, "region_wait_s",
                "retry_tempfail"},
     "warm": {"enabled", "modules", "idle_s", "key_prefixes", "key_names",
              "max_pools_per_uid", "memory_max", "refused": int,
              "cgroups": {"dir": str, "memory": "v2|v1|none", "memory_root": str|null,
                          "memory_max": int|null, "pids": "v2|v1|none",
                          "pids_max": int|null},
              "pools": [{"pid", "uid", "keeper_pid", "key", "version", "interpreter",
                         "modules", "age_s", "commands", "memory_bytes", "cgroup"}]},
     "server": {"requests": int, "errors": int, "refused": {CODE: int},
                "state_save_ms": {"n", "p50", "p99", "max"},
                "lanes": {"in_progress", "bulk_queued", "refused", "bulk_served",
                          "max_requests_per_uid", "max_status_per_uid",
                          "status_per_s_per_uid"}}|null,
     "daemon": {"restarts": int, "adopted_tenants": int, "started_at": float},
     "metrics": {"address": str, "port": int, "scrapes": int}|null}

``vendor`` is the GPU's maker: NVIDIA GPUs are numbered first, AMD GPUs
after them (krexd/hardware/inventory.py, "Numbering"; docs/design/amd.md).  ``devices``'
``minors`` are the NVIDIA GPUs' ``/dev/nvidia<N>``, ``render_minors`` the
AMD GPUs' ``/dev/dri/renderD<N>``.  ``memory.source`` (top level) names the
source of every GPU, ``nvml+amdsmi`` on a host with both.
``slots`` says how ``slots_total`` was chosen (``krexd.config.slot_count``):
``rule`` is one line, e.g. ``auto: 15 = min(cores 15 x 1, memory 139.4 GiB /
1.0 GiB)`` or ``fixed: 4 ([admission] slots_per_gpu = 4)``.
``region`` is the coordinator's own ``status()``: holder, queue, counts and
latency percentiles (ms) ``entry_ms`` (request to grant, as in the
``region_enter`` reply), ``wait_ms`` (for the region lock),
``establish_ms`` (steps 2-5) and ``steps_ms``, the same for each step of
``establish_ms`` by name (``krexd.coordinator.region_stats.STEPS``); ``regions`` also
counts ``adopted``, ``drain_timeouts``, ``freeze_timeouts`` and ``refused``
(failed entries by error code), ``commands_ended`` the commands krex ended
by cause (``krexd.coordinator.region_stats.ENDED_CAUSES``), ``recent_entry_ms`` the
entry percentiles of the last minute (``krexctl top``), ``histograms`` the
cumulative buckets of ``entry_ms``, ``steps_ms`` and ``hold_s`` (what the
Prometheus endpoint exports, ``krexd.server.metrics``).  ``server``'s
``state_save_ms`` is the state save made after each state-changing op,
before its reply (a region entry's reply waits for it too).  ``memory`` per GPU
is ``krexd.memory.status.MemoryStatus.gpu_status``, read from the gate at the
moment of the request (``waiting``: tenants whose
allocation waits for co-tenants' memory; ``blocked``: admission to the GPU
is stopped meanwhile); a parked request's row has ``mem_bytes``,
``waiting_for`` ("slot" or "memory"), ``mem_gpu`` and ``bypassed``.
A tenant's ``need_bytes`` is max(``declared_bytes``, ``learned_bytes``, the
default need) and ``need_source`` names which; ``used_bytes`` is its memory
now, ``peak_bytes`` its peak so far (``shim_peak_bytes``: of the shim's own
count).
Need-to-know: root and the tenant's own uid (its launcher's) see every key
of a tenant row and of a parked request (``queue.queue``) and the holder's
``pid`` in ``gpus[].region.holder``.  Any other caller sees only that the
tenant exists: its row is ``{"id", "gpu", "state", "age_s", "exclusive",
"redacted": true}``, a parked request ``{"gpu", "exclusive", "waiting_s",
"waiting_for", "redacted": true}``, and the holder without ``pid``.  Command
lines carry secrets; pids let a user aim at another's processes.  Warm
pools (``warm.pools``) are shown to root and to their own uid only.
Command lines (``command``) are cut to 512 characters (``krexd.tenancy.quotas.shown_command``).
Served one at a time after region operations, at most ``[daemon]
max_status_per_uid`` per uid at once (``krexd/server/lanes.py``); beyond: ``TOO_MANY``.
Errors: ``BAD_FIELD``, ``TOO_MANY``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Collect krexd's status (see module docstring)."""
    fields.only(req.body)
    return need_to_know(ctx.status(), identity.CALLER.get())


TENANT_PUBLIC = ("id", "gpu", "state", "age_s", "exclusive")
PARKED_PUBLIC = ("gpu", "exclusive", "waiting_s", "waiting_for")


def need_to_know(body: dict[str, Any], who: identity.Caller | None) -> dict[str, Any]:
    """``body`` with other users' tenants reduced to their public keys (module docstring).

    ``who`` None (no verified caller) sees no private key of anyone.
    """
    if who is not None and who.is_root:
        return body

    def mine(row: dict[str, Any]) -> bool:
        return who is not None and row.get("uid") == who.uid

    def public(row: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        return {**{k: row.get(k) for k in keys}, "redacted": True}

    tenants = body.get("tenants") or []
    hidden = {t.get("id") for t in tenants if not mine(t)}
    out = dict(body)
    out["tenants"] = [t if mine(t) else public(t, TENANT_PUBLIC) for t in tenants]
    queue = dict(body.get("queue") or {})
    rows = queue.get("queue") or []
    queue["queue"] = [w if mine(w) else public(w, PARKED_PUBLIC) for w in rows]
    out["queue"] = queue
    out["gpus"] = [_hide_holder_pid(g, hidden) for g in body.get("gpus") or []]
    warm = body.get("warm")
    if isinstance(warm, dict):
        out["warm"] = {**warm, "pools": [p for p in warm.get("pools") or [] if mine(p)]}
    return out


def _hide_holder_pid(gpu: dict[str, Any], hidden: set[Any]) -> dict[str, Any]:
    region = gpu.get("region")
    if not isinstance(region, dict):
        return gpu
    holder = region.get("holder")
    if not isinstance(holder, dict) or holder.get("tenant") not in hidden:
        return gpu
    holder = {k: v for k, v in holder.items() if k != "pid"}
    return {**gpu, "region": {**region, "holder": holder}}
