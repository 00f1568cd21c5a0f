"""Adoption: a restarted krexd takes over the running tenants of the one before.

:func:`load` reads the saved state and maps every saved gate again before
the cgroup tree is touched (anything refused: the safe cleanup of an
unknown tree); :func:`adopt` re-creates the tenants, attaches their slot
memories again, and adopts a region in progress or reopens its gate.
docs/design/daemon.md "Restarts", "Adoption".
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from krexd.cgroups import CgroupBackend, CgroupError, TenantCgroup
from krexd.config.config import Config
from krexd.coordinator.records import tenant_state
from krexd.gate import Gate, GateError, Judge, keep_path
from krexd.orchestration.gpu import Gpu
from krexd.restarts import saved_state
from krexd.system.runtime import Runtime
from krexd.tenancy import states
from krexd.tenancy.memory_records import TenantMemory
from krexd.tenancy.tenants import Tenant, TenantRegistry

_log = logging.getLogger("krexd.adopt")

# Every other saved state is taken for RUNNING; the siblings a region keeps frozen are
# named by its saved region.  The saved state is a resting one (freezing, frozen and
# thawing are saved as running: krexd/restarts/state_fragments.py resting_state), which
# loses nothing only while this holds.
# Keyed by the saved (wire) name.
_RESTORED_STATES = {s.value: s for s in (states.ADMITTED, states.HOLDING)}


class Adopting(Protocol):
    """What adoption needs of the tenant life cycle (``lifecycle.Lifecycle``)."""

    def adopt(self, tenant: Tenant) -> None:
        """Register ``tenant`` and watch its launcher."""
        ...

    async def end(self, tenant: Tenant, reason: str) -> None:
        """End the tenant (recover, kill, free its slot)."""
        ...


class SlotCounter(Protocol):
    """Admission's count of slots (``krexd.tenancy.admission.Admission``)."""

    def adopt(self, gpu: int, exclusive: bool, mem_bytes: int = 0, uid: int = 0) -> None:
        """Count an adopted tenant's slot(s), memory need and its uid's cap."""
        ...


@dataclass
class Saved:
    """A state accepted for adoption and the gates mapped again for it."""

    doc: dict[str, Any]
    gates: dict[int, Gate] = field(default_factory=dict)


def load(
    cfg: Config, cgroups: CgroupBackend, gpus: dict[int, str], judge: Judge | None = None
) -> Saved | None:
    """The saved state to adopt, or None (nothing saved, ``[daemon] adopt = false``, refused).

    ``gpus``: this krexd's GPUs, index -> UUID ("" when unknown); ``judge``: the drains'
    judge of pending owners for each gate opened again (``krexd.gate.Gate``).  Never
    raises: a refusal is logged with its reason and the caller cleans the tree as unknown.
    """
    path = saved_state.path_for(cfg.daemon.gate_dir, cfg.cgroup.name)
    if not cfg.daemon.adopt:
        saved_state.remove(path)
        return None
    try:
        doc = saved_state.load(path, cgroups.root)
        if doc is None:
            return None
        saved = Saved(doc)
        _check_layout(doc, cgroups, gpus)
        for key, g in doc["gpus"].items():
            if g.get("gate"):
                try:
                    saved.gates[int(key)] = Gate.open(
                        g["gate"], int(key), keep_path(g["gate"]), judge
                    )
                except GateError as exc:
                    raise saved_state.StateRefused(f"gate of GPU {key}: {exc}") from None
    except saved_state.StateRefused as exc:
        _log.error("saved state refused, not adopting: %s; cleaning the tree instead", exc)
        saved_state.remove(path)
        return None
    _log.info("adopting %d tenant(s) from %s", len(doc["tenants"]), path)
    return saved


def _check_layout(doc: dict[str, Any], cgroups: CgroupBackend, gpus: dict[int, str]) -> None:
    """Raise StateRefused unless the saved GPUs, backend and cgroup paths fit this krexd.

    A saved GPU must be managed now under the same index, and be the same GPU where
    both krexds knew its UUID: indices shift when a GPU is left out at a start (an AMD
    GPU whose probe failed, say), and a tenant bound to one GPU (its environment, its
    device program) must not be adopted as a tenant of another.

    Every tenant's cgroup must lie inside krexd's own tree (``<root>/gpu<N>/t<id>``):
    krexd kills and removes what it adopts, so a path outside it is never adopted.
    """
    for t in doc["tenants"]:
        cg = t["cgroup"]
        for path, root in ((cg["freezer"], cgroups.root), (cg.get("cpuset"), cgroups.cpuset_root)):
            if path is None:
                continue
            if not _inside(path, root or cgroups.root):
                raise saved_state.StateRefused(
                    f"tenant {t['id']}: cgroup {path!r} is outside krexd's tree {root!r}"
                )
    for key, g in doc["gpus"].items():
        if int(key) not in gpus:
            raise saved_state.StateRefused(f"GPU {key} of the saved state is not managed now")
        was, now = str(g.get("uuid") or ""), gpus[int(key)]
        if was and now and was != now:
            raise saved_state.StateRefused(f"GPU {key} was {was} and is {now} now")
    for t in doc["tenants"]:
        if t["cgroup"].get("kind") != cgroups.cpuset_kind:
            raise saved_state.StateRefused(
                f"cpuset backend changed ({t['cgroup'].get('kind')} -> {cgroups.cpuset_kind})"
            )


def _inside(path: object, root: str) -> bool:
    """True when ``path`` is an absolute path strictly inside directory ``root``."""
    if not isinstance(path, str) or not os.path.isabs(path) or ".." in path.split("/"):
        return False
    return os.path.normpath(path).startswith(os.path.normpath(root) + "/")


def _tenant(t: dict[str, Any]) -> Tenant:
    cg = t["cgroup"]
    known = {f.name for f in dataclasses.fields(TenantMemory)}
    memory = TenantMemory(**{k: v for k, v in t["memory"].items() if k in known})
    return Tenant(
        id=t["id"],
        token=t["token"],
        gpu=t["gpu"],
        argv=list(t["argv"]),
        launcher_pid=t["launcher_pid"],
        cgroup=TenantCgroup(cg["freezer"], cg.get("cpuset"), cg["kind"], cg["cores"]),
        exclusive=bool(t["exclusive"]),
        without_mps=bool(t.get("without_mps", False)),
        # The verified launcher (krexd.tenancy.identity): place and the tenant ops check it.
        uid=t["uid"],
        gid=t["gid"],
        launcher_start=t["launcher_start"],
        pids=set(t["pids"]),
        state=_RESTORED_STATES.get(t["state"], states.RUNNING),
        kill_reason=t.get("kill_reason"),
        memory=memory,
        slots_fd=t.get("slots_fd"),
    )


def adopt(
    saved: Saved,
    registry: TenantRegistry,
    gpus: Mapping[int, Gpu],
    admission: SlotCounter,
    lifecycle: Adopting,
    cgroups: CgroupBackend,
    runtime: Runtime,
) -> list[Tenant]:
    """Take over the saved tenants and regions (daemon.md "Restarts"); returns the tenants.

    Runs on the event loop before krexd serves (pidfds are registered with it).
    """
    doc = saved.doc
    registry.resume_ids(doc["next_tenant_id"])
    adopted: list[Tenant] = []
    gone: list[Tenant] = []
    unattached: list[Tenant] = []  # slot memory lost: krexd could not drain them
    for t in doc["tenants"]:
        tenant = _tenant(t)
        if tenant.gpu not in gpus:
            continue
        admission.adopt(tenant.gpu, tenant.exclusive, tenant.memory.need_bytes, uid=tenant.uid)
        lifecycle.adopt(tenant)
        adopted.append(tenant)
        launcher_alive = saved_state.process_start(tenant.launcher_pid) == tenant.launcher_start
        if not launcher_alive or not os.path.isdir(tenant.cgroup.path):
            gone.append(tenant)
        elif not _attach_registrations(tenant, gpus[tenant.gpu]):
            unattached.append(tenant)
    known = {t.id for t in adopted}
    _kill_orphans(cgroups, known, runtime)
    cgroups.thaw_inner()
    keep_frozen: set[int] = set()
    for key, g in doc["gpus"].items():
        gpu = gpus[int(key)]
        keep_frozen |= _adopt_region(gpu, g, registry, {t.id for t in gone})
        if gpu.gate is not None:
            # Epochs continue from the saved one: acknowledgements of epochs
            # after it are forgeries (krexd.orchestration.gatewatch), and none repeats.
            gpu.gate.set_epoch(max(gpu.gate.epoch, gpu.coordinator.epoch))
    for tenant in adopted:
        if tenant.id in keep_frozen:
            continue
        try:
            tenant.cgroup.thaw()
        except OSError:
            pass
    for tenant in gone:
        runtime.spawn(lifecycle.end(tenant, "its launcher ended while krexd was away"))
    for tenant in unattached:
        tenant.kill_reason = "its slot memory could not be attached again after a krexd restart"
        runtime.spawn(lifecycle.end(tenant, tenant.kill_reason))
    _log.warning(
        "adopted %d tenant(s) (%d to end: launcher gone), %d kept frozen by an adopted region",
        len(adopted),
        len(gone),
        len(keep_frozen),
    )
    return adopted


def _one_holder(registry: TenantRegistry, gpu: int, holder: Tenant | None) -> None:
    """No tenant of GPU ``gpu`` but the adopted region's ``holder`` (None: no region)
    stays HOLDING: one saved while its region was ending (the region no longer saved,
    its holder's state not yet moved back) holds nothing now."""
    for t in registry.on_gpu(gpu):
        if t is not holder:
            tenant_state(t, states.HOLDING, states.RUNNING)  # HOLDING -> RUNNING


def _attach_registrations(tenant: Tenant, gpu: Gpu) -> bool:
    """Attach ``tenant``'s slot memory to ``gpu``'s re-opened gate again; False when lost.

    True as well when there is nothing to attach (no gate, an exclusive
    tenant, or one not placed yet: ``place`` attaches it then).
    """
    if gpu.gate is None or tenant.exclusive or tenant.slots_fd is None:
        return True
    try:
        fd = os.open(
            f"/proc/{tenant.launcher_pid}/fd/{tenant.slots_fd}", os.O_RDONLY | os.O_CLOEXEC
        )
    except OSError as exc:
        _log.error("t%d: slot memory fd %d of its launcher: %s", tenant.id, tenant.slots_fd, exc)
        return False
    try:
        gpu.gate.attach(tenant.id, fd)
    except GateError as exc:
        _log.error("t%d: %s", tenant.id, exc)
        return False
    finally:
        os.close(fd)
    tenant.registrations_attached = True
    _log.info("t%d: slot memory attached to gpu%d's gate again", tenant.id, gpu.index)
    return True


def _adopt_region(
    gpu: Gpu, g: dict[str, Any], registry: TenantRegistry, gone: set[int]
) -> set[int]:
    """Adopt GPU ``gpu``'s saved region or end it; the ids to keep frozen."""
    coordinator = gpu.coordinator
    exited = {int(k): int(v) for k, v in (g.get("exited") or {}).items()}
    r = g.get("region")
    word = gpu.gate.word if gpu.gate is not None else None
    holder = registry.get(r["tenant"]) if r else None
    alive = holder is not None and holder.id not in gone
    if r and alive and holder is not None and (gpu.gate is None or word == (holder.id, r["epoch"])):
        siblings = [s for s in (registry.get(i) for i in r["siblings"]) if s is not None]
        for s in siblings:
            try:
                s.cgroup.freeze()  # it is, unless a watchdog thawed it; then the gate is open
            except OSError:
                continue
            # The region's steps for it, replayed: RUNNING -> FREEZING -> FROZEN.  A sibling
            # not running its command yet (ADMITTED) keeps its state, as in any region (its
            # cgroup is frozen all the same), so that its first place still attaches.
            if tenant_state(s, states.RUNNING, states.FREEZING):
                tenant_state(s, states.FREEZING, states.FROZEN)
        tenant_state(holder, states.RUNNING, states.HOLDING)  # saved as holding: already
        coordinator.resume(g["epoch"], exited)
        cpus = r.get("thread_cpus")
        coordinator.adopt_region(
            holder,
            r["epoch"],
            r["pid"],
            r["tid"],
            siblings,
            tuple(int(c) for c in cpus) if cpus is not None else None,
            r["request"] if isinstance(r.get("request"), str) else None,
        )
        _one_holder(registry, gpu.index, holder)
        return {s.id for s in siblings}
    _one_holder(registry, gpu.index, None)
    if r:
        exited[r["tenant"]] = r["epoch"]  # its re-sent region_exit is answered
    if word is not None and gpu.gate is not None:
        # Closed by an entry in progress or a region not adopted: reopen it for that word.
        try:
            gpu.gate.reopen(*word)
        except GateError as exc:
            _log.error("gpu%d: reopening the gate left closed: %s", gpu.index, exc)
        _log.warning("gpu%d: reopened the gate a crashed krexd left closed %s", gpu.index, word)
    coordinator.resume(max(g["epoch"], word[1] if word else 0), exited)
    return set()


def _kill_orphans(cgroups: CgroupBackend, known: set[int], runtime: Runtime) -> None:
    """Kill and remove tenant directories the saved state does not name."""
    for tid, path in cgroups.tenant_dirs().items():
        if tid in known:
            continue
        cg = TenantCgroup(path, None, "affinity", ())
        _log.warning("t%d: not in the saved state; killing %s", tid, path)
        try:
            cg.kill()
        except CgroupError as exc:
            _log.error("t%d: %s", tid, exc)
            cg.close()
            continue
        runtime.spawn(_remove_when_empty(cg))


async def _remove_when_empty(cg: TenantCgroup) -> None:
    await cg.wait_empty(5.0)
    try:
        cg.remove()
    except CgroupError as exc:
        _log.error("%s", exc)
