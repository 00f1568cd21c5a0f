"""``region_enter``: make the calling tenant the holder of its GPU's critical region.

Request: tenant + token; body ``{"pid": int, "tid": int, "request_id": str?}``
— the requesting process (must be in the tenant's cgroup), its submitting
thread (a Linux thread id of that process, pinned to the reserved cores) and,
optionally, the client's id of this request (at most 64 characters, unique
per request: ``krex_client`` sends ``<pid>-<start time>-<counter>``).  A
second copy of a request with the same id (a re-send after a restart, or
the lost connection's queued copy) gets the first copy's reply and never a
second region; without an id every copy is a new request, as before.
Reply body: ``{"epoch": int, "gpu": int, "reserved_cores": [int], "l2_flush": bool,
"wait_ms": float, "entry_ms": float, "drain_ms": float, "freeze_ms": float,
"check_ms": float}`` — ms: ``wait_ms`` waiting for the region lock,
``entry_ms`` from the request to the grant (``wait_ms`` included),
``drain_ms`` and ``freeze_ms`` steps 3 and 4, ``check_ms`` the fail-closed
check that ends step 4 (part of ``freeze_ms``).

The reply comes once the region is established (paper §4.2 steps 1-5): the
request is parked server-side in FIFO order while another tenant holds the
region.  The caller then flushes L2 through its shim and runs the timed code.
An ``--exclusive`` tenant holds the whole GPU already: it gets a no-op grant
(epoch 0, no reserved cores) at once, so one script runs with and without
``--exclusive``.  A second request from a tenant whose request is queued,
being set up or held is refused ``NESTED_REGION``.
Errors: ``AUTH`` (wrong token, or a caller outside the tenant's cgroup
that is not its launcher: ``krexd.tenancy.identity``), ``BAD_FIELD``,
``NESTED_REGION``, ``REGION_NO_MEMORY`` (its expected memory can never fit
beside its siblings), ``DRAIN_TIMEOUT``,
``FREEZE_TIMEOUT``, ``CANCELLED``, ``SHUTTING_DOWN``.
Sent by: ``krex_client.region.critical()`` on entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext

_MAX_PID = 1 << 22  # Linux pid_max limit
MAX_REQUEST_ID = 64  # characters of a client's request id


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Authenticate, check the fields, run the GPU coordinator's entry."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "region_enter")
    fields.only(req.body, "pid", "tid", "request_id")
    pid = fields.integer(req.body, "pid", 1, _MAX_PID)
    tid = fields.integer(req.body, "tid", 1, _MAX_PID)
    request_id = fields.string(req.body, "request_id", MAX_REQUEST_ID, default=None)
    reply: dict[str, Any] = await ctx.regions(tenant.gpu).enter(tenant, pid, tid, request_id)
    return reply
