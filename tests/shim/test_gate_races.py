"""Slot ownership under races, made deterministic with pause points.

``gate_race`` (tests/shim/c/gate_race.c) runs one tenant-side gate
operation on the test variant of the gate library (``libkrex_gate_test.so``,
built with ``-DKREX_TEST_HOOKS``): it stops at the named point between two
statements (``libkrex_shim/gate/testhook.h``) while the test runs the competing
operation, then goes on.  Each case is a race the ownership word
(krex_gate.h ``krex_slot.owner``) closes: a judgement about a slot's
earlier owner (its process is dead, or has a given pid) must never apply to
a later owner.  The reclaimers are the tenant's own processes (krexd never
writes slot memory); krexd's own judgements (``Gate.ignore``) are bound to
the ownership word the same way.

The invariant checked after every race: each live registrant's slot is
ACTIVE and names it, and no two live registrants share a slot.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from krexd.gate import Gate, GateTimeout
from tests.support import ShimBuild, forget_gate, tenant_env

from .procs import Tenant, slot_of, wait_for

HOLDER = 1
TENANT = 2


class Paused:
    """A ``gate_race`` process stopped at a pause point until :meth:`release`."""

    def __init__(self, build: ShimBuild, gate: Gate, point: str, workdir: Path, *op: str):
        self.flag = workdir / f"pause-{point}"
        env = dict(os.environ, KREX_TEST_PAUSE=point, KREX_TEST_PAUSE_FILE=str(self.flag))
        slots = tenant_env(gate, TENANT)["KREX_SLOTS"]
        self.proc = subprocess.Popen(
            [str(build.prog("gate_race")), gate.path, slots, str(TENANT), *op],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        wait_for(self.flag.exists, what=f"gate_race {' '.join(op)} at {point}")

    def release(self) -> str:
        """Let it run on; its output once it exited."""
        self.flag.unlink()
        out, _ = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0, out
        return out.strip()


def reclaim(build: ShimBuild, gate: Gate) -> int:
    """One reclaim by the tenant's side, unpaused; how many it reclaimed."""
    slots = tenant_env(gate, TENANT)["KREX_SLOTS"]
    out = subprocess.run(
        [str(build.prog("gate_race")), gate.path, slots, str(TENANT), "reclaim"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[1])


def exited_slot(spawn: Callable[..., Tenant]) -> int:
    """A slot left ACTIVE by a registrant that has exited."""
    t = spawn(TENANT, "--calls", "1")
    t.wait_ready()
    t.proc.wait()
    return t.stats()["slot"]


def assert_owned(gate: Gate, live: list[Tenant]) -> None:
    """Every live registrant's slot is ACTIVE and names it; no slot is shared."""
    slots = gate.registrations()
    seen: set[tuple[int, int]] = set()
    for t in live:
        assert t.proc.poll() is None, f"registrant {t.pid} ended"
        i = t.stats()["slot"]
        (s,) = [s for s in slots if (s.tenant, s.index) == (t.tenant, i)]
        assert (s.state, s.pid) == ("active", t.pid), f"slot {i} of live {t.pid}: {s}"
        assert (t.tenant, i) not in seen, f"slot {i} shared by two live registrants"
        seen.add((t.tenant, i))


def register_live(spawn: Callable[..., Tenant], tenant: int = TENANT) -> Tenant:
    t = spawn(tenant, "--call-us", "0", "--gap-us", "1000")
    t.wait_ready()
    return t


def test_two_reclaimers(
    shim_build: ShimBuild, gate: Gate, spawn: Callable[..., Tenant], tmp_path: Path
) -> None:
    """A reclaimer that judged an exited owner dead must not retire the slot's next owner."""
    slot = exited_slot(spawn)
    late = Paused(shim_build, gate, "reclaim_judged", tmp_path, "reclaim")
    assert reclaim(shim_build, gate) == 1  # the second reclaimer frees the slot
    y = register_live(spawn)
    assert y.stats()["slot"] == slot  # the next owner took the same slot
    late.release()
    assert_owned(gate, [y])


def test_reclaim_during_region_frees_once(
    shim_build: ShimBuild, gate: Gate, spawn: Callable[..., Tenant], tmp_path: Path
) -> None:
    """A reclaim that marked a slot DEAD while closed, and a later one, free it once."""
    slot = exited_slot(spawn)
    gate.close(HOLDER, 1)
    late = Paused(shim_build, gate, "reclaim_marked", tmp_path, "reclaim")
    assert slot_of(gate, TENANT, slot).state == "dead"
    gate.reopen(HOLDER, 1)
    assert reclaim(shim_build, gate) == 1  # frees the DEAD slot once the gate is open
    y = register_live(spawn)
    assert y.stats()["slot"] == slot
    late.release()  # its free is from its own DEAD word: it fails
    z = register_live(spawn)
    assert_owned(gate, [y, z])


def test_krexd_judgement_binds_to_the_owner(
    shim_build: ShimBuild, gate: Gate, spawn: Callable[..., Tenant]
) -> None:
    """krexd judged an exited owner gone; the slot changed hands before it said so.

    ``Gate.ignore`` is bound to the ownership word judged: the slot's next
    owner, a live process, is drained all the same.
    """
    slot = exited_slot(spawn)
    judged = slot_of(gate, TENANT, slot)
    assert reclaim(shim_build, gate) == 1
    y = register_live(spawn)
    assert y.stats()["slot"] == slot
    gate.ignore(judged)  # late: about the earlier owner
    assert_owned(gate, [y])
    gate.close(HOLDER, 1)
    acked = gate.wait_drained(HOLDER, 1, 5.0)
    assert [(s.index, s.pid) for s in acked] == [(slot, y.pid)]
    gate.reopen(HOLDER, 1)


def test_forget_pid_matched_an_earlier_owner(
    shim_build: ShimBuild, gate: Gate, spawn: Callable[..., Tenant], tmp_path: Path
) -> None:
    """forget_pid matched the pid of a slot's earlier owner; the slot changed hands."""
    t = spawn(TENANT, "--calls", "1")
    t.wait_ready()
    t.proc.wait()
    slot = t.stats()["slot"]
    late = Paused(shim_build, gate, "forget_matched", tmp_path, "forget", str(t.pid))
    assert reclaim(shim_build, gate) == 1
    y = register_live(spawn)
    assert y.stats()["slot"] == slot
    late.release()
    assert_owned(gate, [y])


def test_stress_reclaimers_registrants_reopen(shim_build: ShimBuild, tmp_path: Path) -> None:
    """Reclaimers, registrants that come and go, and close/reopen cycles at once.

    Throughout, every live registrant's slot is ACTIVE and names it, and
    no two share a slot.
    """
    g = Gate.create(str(tmp_path / "stress.gate"), 0)
    stop = threading.Event()
    errors: list[str] = []
    live: list[Tenant] = []
    lock = threading.Lock()
    slots = tenant_env(g, TENANT)["KREX_SLOTS"]

    def reclaimer() -> None:
        # The tenant's own reclaimers, in a loop until their stdin closes.
        p = subprocess.Popen(
            [str(shim_build.prog("gate_race")), g.path, slots, str(TENANT), "reclaim-loop"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        stop.wait()
        assert p.stdin is not None
        p.stdin.close()
        p.wait(10)

    def closer() -> None:
        epoch = 0
        while not stop.is_set():
            epoch += 1
            g.close(HOLDER, epoch)
            try:
                g.drain(HOLDER, epoch, 0.05)
            except GateTimeout:
                pass
            g.reopen(HOLDER, epoch)
            time.sleep(0.001)

    def checker() -> None:
        while not stop.is_set():
            with lock:
                ready = [t for t in live if t.stats()["ready"] == 1 and t.proc.poll() is None]
                try:
                    assert_owned(g, ready)
                except AssertionError as exc:
                    errors.append(str(exc))
                    stop.set()
            time.sleep(0.002)

    threads = [threading.Thread(target=f) for f in (reclaimer, reclaimer, closer, checker)]
    for th in threads:
        th.start()
    churn: list[Tenant] = []
    try:
        end = time.monotonic() + 3.0
        rng = random.Random(7)
        while time.monotonic() < end and not stop.is_set():
            # Short-lived registrants: register, one call, exit (slot left behind).
            churn = [t for t in churn if t.proc.poll() is None]
            if len(churn) < 2:
                churn.append(Tenant.start(shim_build, g, TENANT, tmp_path, "--calls", "1"))
            with lock:
                for t in [t for t in live if rng.random() < 0.2]:
                    t.kill()
                    live.remove(t)
                if len(live) < 3:
                    live.append(
                        Tenant.start(
                            shim_build, g, TENANT, tmp_path, "--call-us", "0", "--gap-us", "500"
                        )
                    )
            time.sleep(0.01)
    finally:
        stop.set()
        for th in threads:
            th.join()
        for t in live + churn:
            t.kill()
        g.unmap()
        forget_gate(g)
    assert not errors, errors[0]
