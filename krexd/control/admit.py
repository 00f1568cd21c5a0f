"""``admit``: ask for a slot on a GPU; parked in krexd (FIFO) until one is free.

Request body::

    {"argv": [str, ...], "gpu": int?, "exclusive": bool?, "launcher_pid": int?,
     "mem_bytes": int?, "label": str?, "mps": bool?}

Reply body (once granted)::

    {"tenant": int, "token": str, "gpu": int, "env": {str: str},
     "slots": {"size": int, "header": bytes}?}

``env`` is what the command's environment must get (docs/design/interfaces.md
"Environment of a tenant command"): ``KREX_SOCKET``, ``KREX_TENANT``,
``KREX_TOKEN``, ``KREX_GPU``, ``CUDA_VISIBLE_DEVICES``, ``NCCL_NVLS_ENABLE``,
and for shared (non-exclusive) tenants ``KREX_GATE`` and ``LD_PRELOAD`` when
the gate and the shim exist.  ``LD_PRELOAD`` is to be *prepended* to any
value the caller already has.

``slots`` (shared tenants on a GPU with a gate): the tenant's slot memory,
which the launcher creates before it starts the command — a memfd of
exactly ``size`` bytes beginning with ``header``, space reserved, sealed
against shrinking, growing and sealing (``krex_cli.slotmem``) — and names
in ``place`` (docs/design/shim.md "Who writes what").

``mps`` (default true): false makes a shared tenant that is not a client of
its GPU's MPS server (no ``CUDA_MPS_*`` in ``env``): ``krex run``'s re-run of
a GPU-wide fault's suspect, whose own fault then hits nobody else
(docs/design/faults.md).

``mem_bytes`` is the command's memory need (``krex run --mem SIZE``);
without it the need is ``[memory] default_need`` (docs/design/memory.md).
``label`` (``krex run --label L``, at most 512 characters) names the
command for learned needs; without it krexd derives one from ``argv`` (the
script and its arguments).  The need charged is max(``mem_bytes``, the need
learned from earlier runs of the label, the default need).
The need is reserved on the granted GPU until ``release``; a GPU admits the
command only when the need fits there.

The launcher is the kernel-verified caller (``krexd.tenancy.identity``): the process
that sent ``admit`` (``krex run``), with its uid and start time.
``launcher_pid`` is optional and, when given, must be the caller's own pid
(``AUTH`` otherwise); it is never trusted on its own.  Only a direct child of
the launcher with its uid can be placed, and the tenant is ended when
nothing is placed within ``[admission] place_timeout_s``.

No reply is sent while parked: the client just waits (paper §4.3).  If the
launcher exits while parked, the request is withdrawn.
Errors: ``AUTH`` (``launcher_pid`` not the caller), ``BAD_FIELD`` (also a
``mem_bytes`` no GPU can ever hold), ``NO_SUCH_GPU``, ``CANCELLED`` (too many
parked: ``max_parked``, or ``max_parked_per_uid`` of the caller's uid),
``SHUTTING_DOWN``.
Sent by: ``krex run [--gpu N] [--exclusive] [--mem SIZE] [--label L] -- CMD``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Park until a slot is granted, then create the tenant and its cgroup."""
    fields.only(req.body, "argv", "gpu", "exclusive", "launcher_pid", "mem_bytes", "label", "mps")
    argv = fields.str_list(req.body, "argv")
    gpu = fields.integer(req.body, "gpu", 0, 1 << 16, default=None)
    exclusive = fields.boolean(req.body, "exclusive")
    launcher_pid = fields.integer(req.body, "launcher_pid", 1, 1 << 22, default=None)
    mem_bytes = fields.integer(req.body, "mem_bytes", 0, (1 << 60) - 1, default=None)
    label = fields.string(req.body, "label", 512, default=None)
    mps = fields.boolean(req.body, "mps", default=True)
    launcher = identity.caller()
    identity.check_launcher_claim(launcher, launcher_pid)
    tenant = await ctx.lifecycle.admit(
        argv, gpu, exclusive, launcher, mem_bytes, label, without_mps=not mps
    )
    reply = {
        "tenant": tenant.id,
        "token": tenant.token,
        "gpu": tenant.gpu,
        "env": ctx.lifecycle.tenant_env(tenant),
    }
    slots = ctx.lifecycle.registration_memory(tenant)
    if slots is not None:
        reply["slots"] = slots
    return reply
