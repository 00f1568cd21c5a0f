"""The saved state's document (restarts/state_keeper.py): what a region entry costs, what is saved.

Root-free: tenants and GPUs in memory, the state in a temporary directory.
A save encodes again only the tenant records that changed; the document it
writes must decode to what encoding every record from scratch gives, after
any sequence of changes.
"""

from __future__ import annotations

import dataclasses
import json
from json import dumps as _dumps
from pathlib import Path
from typing import Any

import pytest

from krexd.cgroups import TenantCgroup
from krexd.hardware.inventory import fake_gpus
from krexd.restarts import adopt, saved_state
from krexd.restarts.state_keeper import StateKeeper
from krexd.tenancy import states
from krexd.tenancy.memory_records import TenantMemory
from krexd.tenancy.tenants import Tenant, TenantRegistry

ROOT = "/sys/fs/cgroup/krex-test"
RESTING = {states.FREEZING, states.FROZEN, states.THAWING}


class _Coordinator:
    def __init__(self) -> None:
        self.region: dict[str, Any] | None = None
        self.epoch = 0

    def saved(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "region": self.region, "exited": {}}


@dataclasses.dataclass
class _Gpu:
    coordinator: _Coordinator
    gate_path: str | None = "/run/krex/test-gpu0.gate"
    info: Any = dataclasses.field(default_factory=lambda: fake_gpus(1)[0])  # its UUID is saved


def _tenant(tid: int) -> Tenant:
    cg = TenantCgroup(f"{ROOT}/gpu0/t{tid}", f"{ROOT}/gpu0/t{tid}", "v2", (0, 1, 2))
    t = Tenant(
        tid,
        f"{tid:032x}",
        0,
        ["python", f"bench{tid}.py", "--size", "4096"],
        1000 + tid,
        cg,
        uid=1000,
        gid=1000,
        launcher_start=5000 + tid,
        pids={2000 + tid, 3000 + tid},
        memory=TenantMemory(1 << 30, "declared", label=f"bench{tid}", declared_bytes=1 << 30),
    )
    states.change_state(t, states.RUNNING)
    return t


def _reference(registry: TenantRegistry, gpus: dict[int, Any]) -> dict[str, Any]:
    """Every record encoded from scratch, as krexd encoded the whole document before."""
    tenants = [
        {
            "id": t.id,
            "token": t.token,
            "gpu": t.gpu,
            "argv": t.argv,
            "launcher_pid": t.launcher_pid,
            "launcher_start": t.launcher_start,
            "uid": t.uid,
            "gid": t.gid,
            "exclusive": t.exclusive,
            "without_mps": t.without_mps,
            "pids": sorted(t.pids),
            "state": (states.RUNNING if t.state in RESTING else t.state).value,
            "kill_reason": t.kill_reason,
            "slots_fd": t.slots_fd if t.registrations_attached else None,
            "cgroup": {
                "freezer": t.cgroup.freezer_dir,
                "cpuset": t.cgroup.cpuset_dir,
                "kind": t.cgroup.cpuset_kind,
                "cores": list(t.cgroup.cores),
            },
            "memory": dataclasses.asdict(t.memory),
        }
        for t in registry
        if t.state != states.EXITED
    ]
    doc = {
        "cgroup_root": ROOT,
        "next_tenant_id": registry.next_id,
        "restarts": 0,  # restarts continued from (restarts.counters), saved for the next krexd
        "gpus": {
            str(i): {**g.coordinator.saved(), "gate": g.gate_path, "uuid": g.info.uuid}
            for i, g in gpus.items()
        },
        "tenants": tenants,
    }
    decoded: dict[str, Any] = json.loads(_dumps(doc))  # not a test's counting json.dumps
    return decoded


def _saved(path: str) -> dict[str, Any]:
    doc = saved_state.load(path, ROOT)
    assert doc is not None
    for key in ("format", "version", "seq", "saved_at", "pid"):
        del doc[key]
    return doc


def _setup(tmp_path: Path, n: int) -> tuple[TenantRegistry, dict[int, Any], StateKeeper]:
    registry = TenantRegistry()
    gpus: dict[int, Any] = {0: _Gpu(_Coordinator())}
    for _ in range(n):
        registry.add(_tenant(registry.new_id()))
    return registry, gpus, StateKeeper(str(tmp_path / "k.state"), ROOT, registry, gpus)


def test_the_saved_document_equals_one_encoded_from_scratch(tmp_path: Path) -> None:
    registry, gpus, keeper = _setup(tmp_path, 3)
    t1, t2, t3 = list(registry)

    def add() -> None:
        registry.add(_tenant(registry.new_id()))

    def slots() -> None:
        t2.slots_fd, t2.registrations_attached = 7, True

    def memory() -> None:
        t1.memory.observe(t1.memory.peak_bytes + (1 << 30), "fake", 2 << 30)

    def kill() -> None:
        t3.kill_reason = "it ran past max_region_s"

    def exit_() -> None:
        states.change_state(t3, states.EXITED)

    def remove() -> None:
        registry.remove(t3)

    def pids() -> None:
        t2.pids.add(4242)

    def hold() -> None:
        states.change_state(t1, states.HOLDING)
        gpus[0].coordinator.region = {"tenant": 1, "epoch": 1, "pid": 1, "tid": 1, "siblings": []}

    def admitted() -> None:
        t = _tenant(registry.new_id())
        t.state = states.ADMITTED
        registry.add(t)

    steps = [add, slots, memory, kill, pids, hold, exit_, remove, admitted, memory]
    keeper.save()
    assert _saved(keeper.path) == _reference(registry, gpus)
    for step in steps:
        step()
        keeper.save()
        assert _saved(keeper.path) == _reference(registry, gpus), step.__name__
        # A keeper starting afresh (nothing cached) writes the same document.
        fresh = StateKeeper(str(tmp_path / f"{step.__name__}.state"), ROOT, registry, gpus)
        fresh.save()
        assert _saved(fresh.path) == _saved(keeper.path), step.__name__
    assert keeper.writes == len(steps)  # one at the start; none for removing an exited tenant


def test_nothing_changed_writes_nothing(tmp_path: Path) -> None:
    registry, gpus, keeper = _setup(tmp_path, 4)
    keeper.save()
    keeper.save()
    assert keeper.writes == 1
    states.change_state(next(iter(registry)), states.FREEZING)  # saved as running
    keeper.save()
    assert keeper.writes == 1
    next(iter(registry)).memory.waits_seen += 1
    keeper.save()
    assert keeper.writes == 2


def test_a_region_entry_encodes_the_holders_record_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 15 siblings, a region's steps encode at most one tenant record per save."""
    registry, gpus, keeper = _setup(tmp_path, 16)
    holder, *siblings = list(registry)
    keeper.save()
    encoded: list[int] = []
    dumps = json.dumps

    def counting(obj: Any, **kw: Any) -> str:
        out = dumps(obj, **kw)
        encoded[-1] += out.count('"pids":')  # tenant records in this text
        return out

    monkeypatch.setattr(json, "dumps", counting)
    coordinator = gpus[0].coordinator

    def save() -> None:
        encoded.append(0)
        keeper.save()

    for s in siblings:  # step 4: freeze the siblings
        states.change_state(s, states.FREEZING)
    save()
    for s in siblings:
        states.change_state(s, states.FROZEN)
    save()
    states.change_state(holder, states.HOLDING)  # step 5: the grant
    coordinator.epoch += 1
    coordinator.region = {
        "tenant": holder.id,
        "epoch": coordinator.epoch,
        "pid": 1,
        "tid": 1,
        "siblings": [s.id for s in siblings],
        "thread_cpus": None,
    }
    save()
    assert encoded == [0, 0, 1]  # frozen siblings are saved as running: unchanged
    assert _saved(keeper.path) == _reference(registry, gpus)
    for s in siblings:  # step 7: thaw
        states.change_state(s, states.THAWING)
    save()
    for s in siblings:
        states.change_state(s, states.RUNNING)
    states.change_state(holder, states.RUNNING)  # step 8: the exit
    coordinator.region = None
    save()
    assert _saved(keeper.path) == _reference(registry, gpus)
    assert encoded == [0, 0, 1, 0, 1]


def test_resting_states_are_restored_as_the_states_they_stand_for() -> None:
    """Adoption restores a tenant saved in its resting state as it would the state itself."""
    from krexd.restarts.state_fragments import resting_state

    restored = adopt._RESTORED_STATES
    for s in states.TENANT_EDGES:
        assert restored.get(resting_state(s), states.RUNNING) == restored.get(
            s.value, states.RUNNING
        )
    assert resting_state(states.FROZEN) == "running"
    assert resting_state(states.HOLDING) == "holding"
    assert restored["holding"] is states.HOLDING


def test_the_memory_record_is_a_plain_dataclass_of_scalars() -> None:
    """Its ``vars`` are its fields in order, and a copy of them is a snapshot (no shared lists)."""
    rec = TenantMemory(1, "declared", label="x")
    assert "__slots__" not in vars(TenantMemory)
    assert list(vars(rec)) == [f.name for f in dataclasses.fields(TenantMemory)]
    assert all(isinstance(v, (int, str, bool, type(None))) for v in vars(rec).values())


def test_a_record_that_fails_to_encode_is_never_saved_as_its_older_bytes(tmp_path: Path) -> None:
    """A change whose encoding fails must not leave the record marked as encoded: a later
    save (another tenant changed) would write the older record as if it were current."""
    registry, _gpus, keeper = _setup(tmp_path, 2)
    keeper.save()
    first, other = list(registry)
    first.kill_reason = b"not text"  # type: ignore[assignment]  # what JSON cannot encode
    keeper.save()  # logs the error, writes nothing
    other.memory.waits_seen += 1
    keeper.save()  # still cannot encode the first record: writes nothing
    assert keeper.writes == 1
    first.kill_reason = "ended by its holder"
    keeper.save()
    assert keeper.writes == 2
    saved = saved_state.load(keeper.path, ROOT)
    assert saved is not None
    reasons = {r["id"]: r["kill_reason"] for r in saved["tenants"]}
    assert reasons[first.id] == "ended by its holder"
