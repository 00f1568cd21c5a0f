"""The gate protocol without a driver (paper §4.2 steps 2, 3 and 8).

Tenant processes are ``tests/shim/c/gate_tenant.c``: real processes that
register in a real shared-memory gate, make "calls" through
krex_gate_enter/leave from several threads and run a drainer thread; the
coordinator side is krexd.gate on libkrex_gate.so, as krexd uses it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from krexd.gate import (
    TENANT_SLOTS,
    Gate,
    GateBusy,
    GateError,
    GateStale,
    GateTimeout,
    RegistrationInfo,
)
from tests.support import tenant_env

from .procs import ShimBuild, Tenant, alive_judge, cpu_ticks, slot_of, wait_for

HOLDER = 1


def indices(slots: list[RegistrationInfo]) -> list[int]:
    return [s.index for s in slots]


def race(build: ShimBuild, gate: Gate, tenant: int, *op: str) -> str:
    """Run one tenant-side gate operation (tests/shim/c/gate_race.c); its output."""
    slots = tenant_env(gate, tenant)["KREX_SLOTS"]
    out = subprocess.run(
        [str(build.prog("gate_race")), gate.path, slots, str(tenant), *op],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return (out.stdout + out.stderr).strip()


def test_close_drain_reopen(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    t = spawn(2, "--threads", "2", "--call-us", "50")
    t.wait_ready(calls=100)
    gate.close(HOLDER, 1)
    assert gate.word == (HOLDER, 1)
    acked = gate.wait_drained(HOLDER, 1, 5.0)
    slot = t.stats()["slot"]
    assert indices(acked) == [slot]
    # Drained: nothing in flight, and no call starts while the gate is closed.
    s1 = t.stats()
    assert s1["started"] == s1["finished"]
    time.sleep(0.2)
    assert t.stats()["started"] == s1["started"]
    info = slot_of(gate, 2, slot)
    assert info.state == "active" and info.ack_epoch == 1 and info.inflight == 0
    assert info.blocked_calls >= 1
    gate.reopen(HOLDER, 1)
    assert gate.word is None
    wait_for(lambda: t.stats()["started"] > s1["started"] + 100, what="calls resume")


def test_racing_submissions_drained_or_blocked(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    """Thousands of closures land at random moments of four threads' calls.

    After each wait_drained every call that started has finished (it was
    covered by the drain) and none starts until the reopen (the rest were
    blocked before their "driver call").
    """
    t = spawn(2, "--threads", "4", "--call-us", "30", "--gap-us", "20")
    t.wait_ready(calls=50)
    rng = random.Random(1234)
    rounds, raced = 2000, 0
    for epoch in range(1, rounds + 1):
        before = t.stats()
        gate.close(HOLDER, epoch)
        raced += before["started"] != before["finished"]
        gate.wait_drained(HOLDER, epoch, 5.0)
        a = t.stats()
        assert a["started"] == a["finished"], f"round {epoch}: a call in flight after the ack"
        spin_until = time.perf_counter() + rng.uniform(0, 200e-6)
        while time.perf_counter() < spin_until:
            pass
        b = t.stats()
        assert b["started"] == a["started"], f"round {epoch}: a call passed the closed gate"
        gate.reopen(HOLDER, epoch)
        time.sleep(rng.uniform(0, 300e-6))
    assert t.stats()["acks"] == rounds
    # Many closures met a call in progress: submissions were racing them.
    assert raced > rounds // 10, raced


def test_blocked_submitter_uses_no_cpu(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    t = spawn(2, "--threads", "2", "--call-us", "0")
    t.wait_ready(calls=1000)
    # It does burn CPU while the gate is open (100 ticks/s a core; on a busy host it gets
    # less of one, so this waits up to 5 s for the first 10 ticks).
    before_busy = cpu_ticks(t.pid)
    wait_for(lambda: cpu_ticks(t.pid) - before_busy >= 10, 5.0, "10 ticks of CPU")
    gate.close(HOLDER, 1)
    gate.wait_drained(HOLDER, 1, 5.0)
    time.sleep(0.05)
    before = cpu_ticks(t.pid)
    time.sleep(1.0)
    used = cpu_ticks(t.pid) - before
    assert used <= 2, f"blocked tenant used {used} ticks of CPU in 1 s"
    gate.reopen(HOLDER, 1)


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_sibling_dying_mid_drain(gate: Gate, spawn: Callable[..., Tenant], reap: bool) -> None:
    """A sibling stuck in a call dies during the drain: wait_drained returns.

    krexd judges the pending registration's owner (``Gate.judge``; here by
    pid and start time) and skips it from then on.
    """
    gate.judge = alive_judge
    t = spawn(2, "--stuck", "--calls", "1")
    t.wait_ready()
    slot = t.stats()["slot"]
    wait_for(lambda: slot_of(gate, 2, slot).inflight == 1, what="stuck call")
    gate.close(HOLDER, 1)
    result: dict[str, object] = {}

    def drain() -> None:
        t0 = time.monotonic()
        try:
            result["acked"] = gate.wait_drained(HOLDER, 1, 10.0)
        except GateError as exc:
            result["error"] = exc
        result["s"] = time.monotonic() - t0

    th = threading.Thread(target=drain)
    th.start()
    time.sleep(0.3)
    assert th.is_alive(), "drain finished although the sibling never acknowledged"
    killed_at = time.monotonic()
    os.kill(t.pid, signal.SIGKILL)
    if reap:
        t.proc.wait()
    th.join(5.0)
    assert not th.is_alive(), "wait_drained hangs on a dead sibling"
    assert "error" not in result, result
    assert time.monotonic() - killed_at < 1.0
    assert result["acked"] == []
    # krexd's judgement is its own: the slot itself still says active.
    info = slot_of(gate, 2, slot)
    assert info.state == "dead" and info.ignored
    # A newcomer of the same tenant does not take it during the region.
    newcomer = spawn(2)
    wait_for(lambda: any(s.pid == newcomer.pid for s in gate.registrations()), what="newcomer")
    taken = [s.index for s in gate.registrations() if s.pid == newcomer.pid]
    assert taken != [slot]
    gate.reopen(HOLDER, 1)
    t.proc.wait()


def test_drain_timeout_names_pending_slot(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    t = spawn(2, "--no-ack")
    t.wait_ready()
    slot = t.stats()["slot"]
    gate.close(HOLDER, 9)
    t0 = time.monotonic()
    with pytest.raises(GateTimeout) as exc:
        gate.wait_drained(HOLDER, 9, 0.3)
    assert 0.3 <= time.monotonic() - t0 < 2.0
    assert indices(exc.value.pending) == [slot]
    assert f"pid {t.pid}" in exc.value.describe()
    gate.reopen(HOLDER, 9)


def test_stale_epochs_refused(gate: Gate) -> None:
    gate.close(HOLDER, 5)
    with pytest.raises(GateBusy):
        gate.close(2, 6)
    with pytest.raises(GateStale):
        gate.reopen(HOLDER, 4)  # an older region's late recovery
    with pytest.raises(GateStale):
        gate.reopen(2, 5)
    with pytest.raises(GateStale):
        gate.wait_drained(HOLDER, 4, 1.0)
    assert gate.word == (HOLDER, 5)
    gate.reopen(HOLDER, 5)
    with pytest.raises(GateStale):
        gate.reopen(HOLDER, 5)
    assert gate.word is None
    with pytest.raises(ValueError):
        gate.close(0, 1)
    with pytest.raises(ValueError):
        gate.close(1, 0)


def test_registration_waits_for_reopen(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    """A process that registers while the gate is closed acknowledges and parks."""
    gate.close(HOLDER, 3)
    t = spawn(2)
    wait_for(lambda: any(s.pid == t.pid for s in gate.registrations()), what="registration")
    (mine,) = [s.index for s in gate.registrations() if s.pid == t.pid]
    # It acknowledged the closure itself: it has no work and no drainer yet.
    assert indices(gate.wait_drained(HOLDER, 3, 2.0)) == [mine]
    time.sleep(0.2)
    assert t.stats()["started"] == 0 and t.stats()["ready"] == 0
    # A second closure while it is still parked is acknowledged too.
    gate.reopen(HOLDER, 3)
    gate.close(HOLDER, 4)
    gate.wait_drained(HOLDER, 4, 2.0)
    gate.reopen(HOLDER, 4)
    t.wait_ready(calls=10)


def test_holder_calls_pass(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    t = spawn(HOLDER, "--call-us", "10")
    other = spawn(2, "--call-us", "10")
    t.wait_ready(calls=10)
    other.wait_ready(calls=10)
    gate.close(HOLDER, 1)
    assert indices(gate.wait_drained(HOLDER, 1, 2.0)) == [other.stats()["slot"]]
    n = t.stats()["started"]
    m = other.stats()["started"]
    wait_for(lambda: t.stats()["started"] > n + 100, what="holder's calls")
    assert other.stats()["started"] == m
    gate.reopen(HOLDER, 1)


def test_reclaim_dead(shim_build: ShimBuild, gate: Gate, spawn: Callable[..., Tenant]) -> None:
    """The tenant's own registrants reclaim its exited processes' slots (krexd never does)."""
    t = spawn(2, "--calls", "1")
    t.wait_ready()
    slot = t.stats()["slot"]
    t.proc.wait()  # exited normally, slot left behind
    assert slot_of(gate, 2, slot).state == "active"
    assert race(shim_build, gate, 2, "reclaim") == "rc 1"
    assert slot_of(gate, 2, slot).state == "free"
    assert race(shim_build, gate, 2, "reclaim") == "rc 0"


def test_exec_forgets_the_old_image(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    """After an execve the pid stays but the drainer is gone: the new image frees the slot."""
    t = spawn(2, "--exec")
    t.wait_ready()
    assert t.stats()["forgotten"] == 1
    mine = [s for s in gate.registrations() if s.pid == t.pid and s.state != "free"]
    assert len(mine) == 1 and mine[0].index == t.stats()["slot"]
    gate.close(HOLDER, 1)
    gate.wait_drained(HOLDER, 1, 2.0)
    gate.reopen(HOLDER, 1)


def test_tenants_map_only_a_gate_krexd_made(
    shim_build: ShimBuild, gate: Gate, tmp_path: Path
) -> None:
    """The gate is root's and 0644 whatever the umask; a tenant refuses any other."""
    path = tmp_path / "umask.gate"
    old_umask = os.umask(0o077)
    try:
        g = Gate.create(str(path), 3)
    finally:
        os.umask(old_umask)
    st = path.stat()
    assert (st.st_mode & 0o777) == 0o644 and st.st_uid == 0
    g.unmap()
    assert race(shim_build, gate, 2, "reclaim") == "rc 0"  # the fixture's gate maps
    os.chmod(gate.path, 0o666)  # writable by others: not one krexd made
    assert "Operation not permitted" in race(shim_build, gate, 2, "reclaim")
    os.chmod(gate.path, 0o644)
    data = bytearray(path.read_bytes())
    data[8] = 1  # version 1
    path.write_bytes(bytes(data))
    os.chmod(path, 0o644)
    bad = subprocess.run(
        [
            str(shim_build.prog("gate_race")),
            str(path),
            tenant_env(gate, 2)["KREX_SLOTS"],
            "2",
            "reclaim",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "Protocol error" in bad.stderr


def test_create_replaces_atomically(shim_build: ShimBuild, tmp_path: Path) -> None:
    """krexd recreates its gates at start; a process mapping the old one keeps it."""
    path = str(tmp_path / "gpu0.gate")
    old = Gate.create(path, 0)
    old.close(HOLDER, 1)
    new = Gate.create(path, 0)
    assert new.word is None and old.word == (HOLDER, 1)
    old.unmap()
    with pytest.raises(GateError, match="unmapped"):
        old.close(HOLDER, 2)
    new.unlink()
    assert not os.path.exists(path)


def test_full_tenant_reclaims_exited_processes(
    shim_build: ShimBuild, gate: Gate, spawn: Callable[..., Tenant]
) -> None:
    """A registrant that finds every slot of its tenant taken reclaims those of exited ones."""
    slots = tenant_env(gate, 2)["KREX_SLOTS"]
    # Fill the tenant's slot memory with registrants that exit at once.
    procs = [
        subprocess.Popen(
            [str(shim_build.prog("gate_race")), gate.path, slots, "2", "register"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(TENANT_SLOTS)
    ]
    for p in procs:
        assert p.wait(30) == 0
    assert [s.state for s in gate.registrations()] == ["active"] * TENANT_SLOTS
    alive = spawn(2, "--calls", "0")
    alive.wait_ready()
    mine = [s for s in gate.registrations() if s.pid == alive.pid]
    assert len(mine) == 1 and mine[0].state == "active"
    assert sum(s.state == "free" for s in gate.registrations()) >= TENANT_SLOTS - 1


def test_the_drain_backs_off_polling_a_slot_that_shows_a_call_in_flight(gate: Gate) -> None:
    """A slot that acknowledged with a call in flight is polled from 50 µs, backing off.

    The slot is forged in the tenant's own slot memory (as a tenant could): it
    names this live process, so krexd's judge keeps it pending for the whole
    timeout.  Polling every 50 µs made thousands of scans in 0.3 s; backing
    off to 4 ms makes about a hundred (the judge's 5 ms slices included).
    """
    import mmap

    from krexd.tenancy.registrations import identity

    tenant_env(gate, 2)
    fd = gate.__dict__["_test_slot_fds"][2]
    me = identity(os.getpid())
    assert me is not None
    with mmap.mmap(fd, os.fstat(fd).st_size) as m:
        base = 64  # slot 0 (krex_gate.h: a 64-byte header, 128-byte slots)
        m[base + 8 : base + 12] = (1).to_bytes(4, "little")  # one call in flight
        m[base + 12 : base + 16] = (9).to_bytes(4, "little")  # acknowledged epoch 9
        m[base + 16 : base + 20] = (2).to_bytes(4, "little")  # tenant 2
        m[base + 48 : base + 56] = me.start_ticks.to_bytes(8, "little")
        m[base : base + 8] = (os.getpid() << 32 | 2 << 8 | 2).to_bytes(8, "little")  # ACTIVE
    gate.close(HOLDER, 9)
    before = gate.drain_scans
    with pytest.raises(GateTimeout):
        gate.drain(HOLDER, 9, 0.3)
    scans = gate.drain_scans - before
    gate.reopen(HOLDER, 9)
    assert 10 < scans < 400, scans
