"""``status``: everything ``krexctl status`` shows, need-to-know.

Request, reply, errors and who sends it: docs/design/interfaces.md "Control plane".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Collect krexd's status (docs/design/interfaces.md "Control plane")."""
    fields.only(req.body)
    return need_to_know(ctx.status(), identity.CALLER.get())


TENANT_PUBLIC = ("id", "gpu", "state", "age_s", "exclusive")
PARKED_PUBLIC = ("gpu", "exclusive", "waiting_s", "waiting_for")


def need_to_know(body: dict[str, Any], who: identity.Caller | None) -> dict[str, Any]:
    """``body`` with other users' tenants reduced to their public keys (need-to-know).

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
