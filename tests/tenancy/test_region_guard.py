"""The fail-closed check (krexd.tenancy.registrations.RegionGuard) against real processes.

A sibling frozen between its count's increment and the retraction a closed
gate causes shows ``inflight`` 1, and one that registered after the close
shows an old ``ack_epoch``: neither can start work, and neither may be
ended (on the H200 the old rule ended one command in eight of a PyTorch
corpus with exit 79).  A process with the GPU open and no registration, or
a registration whose shim image is gone, still is.

Root-free: the "sibling" is a real ``sleep`` with the real shim preloaded
(pass-through: no krexd), its registration a RegistrationInfo built from /proc.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from krexd.gate import RegistrationInfo
from krexd.tenancy.registrations import RegionGuard, identity

pytestmark = pytest.mark.needs_build

SHIM = os.path.join(os.path.dirname(__file__), "..", "..", "build", "lib", "libkrex_shim.so")
EPOCH = 7


@dataclass
class _Cgroup:
    procs: list[int]

    def pids(self) -> list[int]:
        return list(self.procs)


@dataclass
class _Tenant:
    id: int
    cgroup: _Cgroup = field(default_factory=lambda: _Cgroup([]))


def _shim_image(pid: int) -> int:
    """The shim's image token in ``pid``: its mapping's start | pages (krex_gate.h, shim.c)."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "libkrex_shim" in line and " r-xp " in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                return lo | ((hi - lo) >> 12)
    raise AssertionError("the shim is not mapped")


@pytest.fixture
def sibling() -> Iterator[int]:
    if not os.path.exists(SHIM):
        pytest.skip("build/lib/libkrex_shim.so is missing: run make")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    p = subprocess.Popen(["sleep", "60"], env={**env, "LD_PRELOAD": os.path.abspath(SHIM)})
    try:
        for _ in range(200):  # until the loader has mapped the shim
            try:
                _shim_image(p.pid)
                break
            except AssertionError:
                os.sched_yield()
        yield p.pid
    finally:
        p.kill()
        p.wait()


def _slot(pid: int, **kw: Any) -> RegistrationInfo:
    who = identity(pid)
    assert who is not None
    base: dict[str, Any] = dict(
        index=0,
        state="active",
        pid=who.nspid,
        tenant=2,
        inflight=0,
        ack_epoch=EPOCH,
        captures=0,
        gated_calls=1,
        blocked_calls=0,
        last_drain_ns=0,
        start_ticks=who.start_ticks,
        image=_shim_image(pid),
        pidns=who.pidns,
        claimed_tenant=2,
    )
    return RegistrationInfo(**(base | kw))


def _unprotected(pid: int, slots: list[RegistrationInfo]) -> list[str]:
    tenant = _Tenant(2, _Cgroup([pid]))
    guard = RegionGuard(lambda: {pid}, lambda: slots)
    return [u.describe() for u in guard.unprotected([tenant], EPOCH)]  # type: ignore[list-item]


def test_a_drained_registration_is_protected(sibling: int) -> None:
    assert _unprotected(sibling, [_slot(sibling)]) == []


def test_frozen_between_increment_and_retraction_is_not_ended(sibling: int) -> None:
    assert _unprotected(sibling, [_slot(sibling, inflight=1)]) == []


def test_registered_after_the_close_and_frozen_before_its_ack_is_not_ended(sibling: int) -> None:
    assert _unprotected(sibling, [_slot(sibling, ack_epoch=0)]) == []


def test_no_registration_is_ended(sibling: int) -> None:
    found = _unprotected(sibling, [])
    assert len(found) == 1 and "never registered" in found[0], found


def test_a_registration_of_another_image_is_ended(sibling: int) -> None:
    image = _shim_image(sibling)
    found = _unprotected(sibling, [_slot(sibling, image=image + (1 << 20))])
    assert len(found) == 1 and "exec'd another program" in found[0], found


def test_a_registration_naming_another_process_is_ended(sibling: int) -> None:
    # Same pid and namespace, another start time: the message says which differs.
    found = _unprotected(sibling, [_slot(sibling, start_ticks=1)])
    assert len(found) == 1 and "registration gives start time 1" in found[0], found


def test_gpu_users_are_asked_only_when_a_sibling_process_is_unverified(sibling: int) -> None:
    """NVML's process list costs a driver query per entry: not asked when every sibling verifies."""
    asked: list[int] = []

    def users() -> set[int]:
        asked.append(1)
        return {sibling}

    tenant = _Tenant(2, _Cgroup([sibling]))
    verified = RegionGuard(users, lambda: [_slot(sibling)])
    assert verified.unprotected([tenant], EPOCH) == []  # type: ignore[list-item]
    assert asked == []
    unverified = RegionGuard(users, lambda: [])
    found = unverified.unprotected([tenant], EPOCH)  # type: ignore[list-item]
    assert asked == [1] and [u.pid for u in found] == [sibling]


def test_an_unverified_process_without_the_gpu_open_is_not_ended(sibling: int) -> None:
    """A sibling's helper process (a compiler, a shell) with no context is not GPU use."""
    tenant = _Tenant(2, _Cgroup([sibling]))
    guard = RegionGuard(lambda: {1}, lambda: [])
    assert guard.unprotected([tenant], EPOCH) == []  # type: ignore[list-item]


def test_when_who_has_the_gpu_open_cannot_be_read(sibling: int) -> None:
    """Unknown users: the check is skipped where the shim gates the GPU's commands, and
    every unverified sibling process counts as using the GPU where it does not (AMD)."""
    tenant = _Tenant(2, _Cgroup([sibling]))
    assert RegionGuard(lambda: None, lambda: []).unprotected([tenant], EPOCH) == []  # type: ignore[list-item]
    guard = RegionGuard(lambda: None, lambda: [], unknown_is_open=True)
    (found,) = guard.unprotected([tenant], EPOCH)  # type: ignore[list-item]
    assert found.pid == sibling and "cannot be read" in found.cause
    verified = RegionGuard(lambda: None, lambda: [_slot(sibling)], unknown_is_open=True)
    assert verified.unprotected([tenant], EPOCH) == []  # type: ignore[list-item]
    # an empty list is an answer (nobody has it open), not "cannot tell"
    assert (
        RegionGuard(lambda: set(), lambda: [], unknown_is_open=True).unprotected(
            [tenant],  # type: ignore[list-item]
            EPOCH,
        )
        == []
    )


_LEADER_EXITS = (
    "import ctypes, threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,)).start()\n"
    "time.sleep(0.2)\n"
    "ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86-64): this thread only\n"
)


def _wait_leader_exited(pid: int, deadline: float) -> None:
    """Until ``pid``'s leader thread shows Z (its other thread runs on)."""
    while True:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return
        assert time.monotonic() < deadline, "the main thread did not exit"
        time.sleep(0.02)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="SYS_exit's number is x86-64's")
def test_a_process_whose_main_thread_exited_is_still_checked() -> None:
    """Its leader shows Z while another thread runs with the address space and descriptors:
    not "gone", so a process with the GPU open this way is still ended."""
    from krexd.system.procfs import pid_alive

    p = subprocess.Popen([sys.executable, "-c", _LEADER_EXITS])
    try:
        _wait_leader_exited(p.pid, time.monotonic() + 10)
        assert identity(p.pid) is not None and pid_alive(p.pid)
        tenant = _Tenant(2, _Cgroup([p.pid]))
        guard = RegionGuard(lambda: {p.pid}, lambda: [])
        assert [u.pid for u in guard.unprotected([tenant], EPOCH)] == [p.pid]  # type: ignore[list-item]
    finally:
        p.kill()
        p.wait()
    assert identity(p.pid) is None


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="SYS_exit's number is x86-64's")
def test_a_registered_process_whose_main_thread_exited_is_not_ended() -> None:
    """Its leader's maps and map_files are empty; a live thread's maps still show the shim."""
    if not os.path.exists(SHIM):
        pytest.skip("build/lib/libkrex_shim.so is missing: run make")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    slow = _LEADER_EXITS.replace("time.sleep(0.2)", "time.sleep(1.0)")
    p = subprocess.Popen(
        [sys.executable, "-c", slow], env={**env, "LD_PRELOAD": os.path.abspath(SHIM)}
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # the registration, as the shim writes it, while the leader lives
            try:
                slot = _slot(p.pid)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "the shim was not mapped"
                time.sleep(0.02)
        _wait_leader_exited(p.pid, deadline)
        tenant = _Tenant(2, _Cgroup([p.pid]))
        assert RegionGuard(lambda: {p.pid}, lambda: [slot]).unprotected([tenant], EPOCH) == []  # type: ignore[list-item]
        found = RegionGuard(lambda: {p.pid}, lambda: []).unprotected([tenant], EPOCH)  # type: ignore[list-item]
        assert [u.pid for u in found] == [p.pid] and "never registered" in found[0].cause
    finally:
        p.kill()
        p.wait()


def test_a_start_time_matches_within_the_slack_of_another_time_namespace() -> None:
    """A process of another time namespace: one tick either way (the shim takes a
    boot-time offset back out, exact only for whole ticks); else exactly; 0 never."""
    from krexd.tenancy.registrations import Identity, matches

    def slot(ticks: int) -> RegistrationInfo:
        return RegistrationInfo(0, "active", 42, 1, 0, 0, 0, 0, 0, 0, start_ticks=ticks, pidns=9)

    here, other = Identity(100, 42, 9, 500), Identity(100, 42, 9, 500, start_slack=1)
    assert matches(slot(500), here) and not matches(slot(501), here)
    assert matches(slot(499), other) and matches(slot(501), other)
    assert not matches(slot(502), other)
    assert not matches(slot(0), Identity(100, 42, 9, 0, start_slack=1))
