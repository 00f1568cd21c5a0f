"""The checkpoint lock and per-process activity of the fake driver, across processes.

``fakelock`` (progs/fakelock.c) locks, unlocks and reads the state of another
process as krexd will, with cuInit only; the timeline shows when the locked
process's work ran.  Semantics: tests/fakecuda/README.md "Checkpoint lock".
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krexd.hardware.inventory import GpuInfo
from krexd.memory import sources
from krexd.memory.activity import FakeActivitySource
from krexd.memory.sources import FakeStateSource
from tests.fakecuda import timeline
from tests.fakecuda.harness import HERE, FakeCuda
from tests.fakecuda.timeline import Record

MS = 1_000_000
# Enqueues 5 x 100 ms of kernels, then waits on stdin without calling the driver.
IDLE_AFTER_LAUNCHES = """
import fakegpu, sys
fakegpu.init()
for _ in range(5):
    fakegpu.launch(100_000_000)
print("ready", flush=True)
sys.stdin.read()
"""


def _start(fc: FakeCuda, prog: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(prog), *args],
        env=fc.env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _bench(fc: FakeCuda, *args: str, **env: str) -> subprocess.Popen[str]:
    return _start(fc, fc.build.fakebench, *args, **env)


def _ops(fc: FakeCuda, pid: int, n: int = 1, after_ns: int = 0) -> list[Record]:
    """The pid's timeline records once it has ``n`` starting at or after ``after_ns``."""
    deadline = time.monotonic() + 5
    while True:
        recs = timeline.by_pid(fc.records()).get(pid, [])
        if sum(r.start_ns >= after_ns for r in recs) >= n:
            return recs
        assert time.monotonic() < deadline, f"pid {pid}: {len(recs)} records"
        time.sleep(0.01)


def _stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait()


def test_lock_waits_for_queued_work_and_holds_the_process_until_unlock(fc: FakeCuda) -> None:
    # Rounds of 100 x 10 ms kernels (1 s queued), each followed by a synchronize.
    bench = _bench(fc, "--seconds", "4", "--kernel-ns", str(10 * MS), "--sync-every", "100")
    try:
        _ops(fc, bench.pid, 100)
        pid = bench.pid
        steps = fc.lock_steps(
            "state",
            pid,
            "lock",
            pid,
            "lock",
            pid,
            "state",
            pid,
            "sleep",
            300,
            "unlock",
            pid,
            "state",
            pid,
            "unlock",
            pid,
        )
        before, lock, again, locked, unlock, after, unlock2 = steps
        assert (before["state"], locked["state"], after["state"]) == (
            "RUNNING",
            "LOCKED",
            "RUNNING",
        )
        assert lock["result"] == unlock["result"] == "CUDA_SUCCESS"
        assert again["result"] == unlock2["result"] == "CUDA_ERROR_ILLEGAL_STATE"
        assert lock["elapsed_ms"] > 500, "about 1 s of kernels was queued"
        recs = _ops(fc, pid, 1, after_ns=unlock["start_ns"])
        # Every kernel enqueued before the lock returned had ended by then ...
        first_round = [r for r in recs if r.start_ns < lock["end_ns"]]
        assert len(first_round) >= 100
        assert max(r.end_ns for r in first_round) <= lock["end_ns"]
        # ... none started while locked, and the next one only after the unlock.
        assert not [r for r in recs if lock["end_ns"] <= r.start_ns < unlock["start_ns"]]
        assert min(r.start_ns for r in recs if r.start_ns >= lock["end_ns"]) >= unlock["start_ns"]
    finally:
        _stop(bench)


def test_lock_waits_for_work_queued_by_a_process_making_no_call(fc: FakeCuda) -> None:
    idle = subprocess.Popen(
        [sys.executable, "-c", IDLE_AFTER_LAUNCHES],
        env=fc.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert idle.stdout is not None and idle.stdout.readline() == "ready\n"
        (lock,) = fc.lock_steps("lock", idle.pid)
        recs = timeline.by_pid(fc.records())[idle.pid]
        assert lock["result"] == "CUDA_SUCCESS" and len(recs) == 5
        assert lock["end_ns"] >= recs[-1].end_ns > lock["start_ns"]
    finally:
        _stop(idle)


def test_a_lock_that_times_out_leaves_the_process_running(fc: FakeCuda) -> None:
    bench = _bench(fc, "--seconds", "3", "--kernel-ns", str(50 * MS), "--sync-every", "10")
    try:
        _ops(fc, bench.pid, 10)
        lock, state = fc.lock_steps("lock", bench.pid, 100, "state", bench.pid)
        assert lock["result"] == "CUDA_ERROR_NOT_READY", "as measured on driver 580"
        assert 90 <= lock["elapsed_ms"] < 1000  # the timeout, not a hang (loose: a busy host)
        assert state["state"] == "RUNNING"
        _ops(fc, bench.pid, 1, after_ns=lock["end_ns"])  # it runs on
    finally:
        _stop(bench)


def test_lock_of_a_process_waiting_in_stream_synchronize(fc: FakeCuda) -> None:
    bench = _bench(fc, "--count", "2", "--kernel-ns", str(400 * MS), "--sync-every", "1")
    (first,) = _ops(fc, bench.pid, 1)
    lock, unlock = fc.lock_steps("lock", bench.pid, "sleep", 300, "unlock", bench.pid)
    out, err = bench.communicate(timeout=10)
    assert bench.returncode == 0, err
    assert json.loads(out)["kernels"] == 2
    assert lock["result"] == "CUDA_SUCCESS" and lock["end_ns"] >= first.end_ns
    second = timeline.by_pid(fc.records())[bench.pid][1]
    assert second.start_ns >= unlock["start_ns"], "the unlock woke it; the next kernel followed"


def test_lock_needs_a_process_that_initialized_the_driver(fc: FakeCuda) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    init_only = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fakegpu, sys\nfakegpu.Driver().call('cuInit', 0)\n"
            "print('ready', flush=True)\nsys.stdin.read()",
        ],
        env=fc.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert init_only.stdout is not None and init_only.stdout.readline() == "ready\n"
        steps = fc.lock_steps(
            "lock", sleeper.pid, "lock", gone.pid, "unlock", sleeper.pid, "state", sleeper.pid
        )
        # As measured on driver 580: a live process without CUDA, a pid of no process.
        assert [s["result"] for s in steps[:2]] == [
            "CUDA_ERROR_NOT_INITIALIZED",
            "CUDA_ERROR_OPERATING_SYSTEM",
        ]
        assert [s["result"] for s in steps[2:]] == ["CUDA_ERROR_INVALID_VALUE"] * 2
        # cuInit alone makes a process lockable; krexd's memory view does not list it.
        steps = fc.lock_steps("lock", init_only.pid, "unlock", init_only.pid)
        assert [s["result"] for s in steps] == ["CUDA_SUCCESS"] * 2
        gpus = [GpuInfo(0, "sim", 80 << 30, 50 << 20, None, True)]
        assert init_only.pid not in (
            FakeStateSource(gpus, str(fc.state_path)).read()[0].per_pid or {}
        )
    finally:
        _stop(sleeper)
        _stop(init_only)


def _record_pids(path: Path) -> set[int]:
    data = path.read_bytes()
    offs = range(sources.FAKE_PROCS_OFF, sources.FAKE_RECORDS_BYTES, sources.FAKE_PROC_BYTES)
    return {struct.unpack_from("<i", data, off)[0] for off in offs} - {0}


def test_a_killed_locked_process_leaks_nothing(fc: FakeCuda) -> None:
    victim = _bench(fc, "--count", "1", "--kernel-ns", str(100 * MS))
    _ops(fc, victim.pid)
    (lock,) = fc.lock_steps("lock", victim.pid)
    assert lock["result"] == "CUDA_SUCCESS"
    _stop(victim)
    state, unlock = fc.lock_steps("state", victim.pid, "unlock", victim.pid)
    assert state["result"] == unlock["result"] == "CUDA_ERROR_INVALID_VALUE"
    assert unlock["elapsed_ms"] < 500
    assert victim.pid not in _record_pids(fc.state_path), "its record was reclaimed"
    # A lock waiting for a process that is killed returns instead of hanging.
    busy = _bench(fc, "--count", "1", "--kernel-ns", str(3000 * MS))
    _ops(fc, busy.pid)
    locker = _start(fc, fc.build.fakelock, "lock", str(busy.pid))
    time.sleep(0.2)
    _stop(busy)
    out, _ = locker.communicate(timeout=2)
    assert json.loads(out)["result"] == "CUDA_ERROR_OPERATING_SYSTEM", "as for a dead pid"


def test_a_second_copy_of_the_driver_in_the_process_is_locked_too(
    fc: FakeCuda, tmp_path: Path
) -> None:
    plugin = tmp_path / "libcuda-plugin.so.1"  # another file: the loader maps it again
    shutil.copy(fc.build.lib_dir / "libcuda.so.1", plugin)
    deep = _start(fc, fc.build.fakedeep, str(plugin), "1.2", str(2 * MS))
    _ops(fc, deep.pid, 5)
    lock, unlock = fc.lock_steps("lock", deep.pid, "sleep", 300, "unlock", deep.pid)
    out, err = deep.communicate(timeout=10)
    assert deep.returncode == 0, err
    summary = json.loads(out)
    assert summary["distinct"] is True, "the launches went through a second copy"
    assert lock["result"] == unlock["result"] == "CUDA_SUCCESS"
    recs = timeline.by_pid(fc.records())[deep.pid]
    assert not [r for r in recs if lock["end_ns"] <= r.start_ns < unlock["start_ns"]]
    assert [r for r in recs if r.start_ns >= unlock["start_ns"]], "it ran on after the unlock"


def test_an_mps_client_cannot_be_locked(fc: FakeCuda, tmp_path: Path) -> None:
    mps = {"KREX_FAKE_MPS": "1", "KREX_FAKE_MPS_STATE": str(tmp_path / "server")}
    client = _bench(fc, "--seconds", "3", "--kernel-ns", str(MS), **mps)
    plain = _bench(fc, "--seconds", "3", "--kernel-ns", str(MS))
    try:
        _ops(fc, client.pid)
        _ops(fc, plain.pid)
        lock, state, other, unlock = fc.lock_steps(
            "lock", client.pid, "state", client.pid, "lock", plain.pid, "unlock", plain.pid
        )
        assert lock["result"] == "CUDA_ERROR_NOT_SUPPORTED" and lock["elapsed_ms"] < 500
        assert state["state"] == "RUNNING"
        assert other["result"] == unlock["result"] == "CUDA_SUCCESS", "only the MPS client"
        assert _record_flags(fc.state_path) == {client.pid: 3, plain.pid: 1}  # listed, MPS
    finally:
        _stop(client)
        _stop(plain)


def _record_flags(path: Path) -> dict[int, int]:
    data = path.read_bytes()
    offs = range(sources.FAKE_PROCS_OFF, sources.FAKE_RECORDS_BYTES, sources.FAKE_PROC_BYTES)
    flags = {}
    for off in offs:
        (pid,) = struct.unpack_from("<i", data, off)
        if pid > 0:
            flags[pid] = struct.unpack_from("<I", data, off + sources.FAKE_FLAGS_OFF)[0]
    return flags


def _cgroup2_mount() -> str | None:
    with open("/proc/self/mounts") as f:
        for line in f:
            _, mnt, fstype, *_ = line.split()
            if fstype == "cgroup2":
                return mnt
    return None


_cgroups = itertools.count()


@pytest.fixture
def frozen_cgroup() -> Iterator[Path]:
    """A fresh cgroup v2 directory; thawed, emptied and removed afterwards."""
    mount = _cgroup2_mount()
    if os.geteuid() != 0 or mount is None:
        pytest.skip("needs root and a cgroup2 mount")
    cg = Path(mount) / f"krex-fakecuda-test-{os.getpid()}-{next(_cgroups)}"
    cg.mkdir()
    try:
        yield cg
    finally:
        _freeze(cg, False)
        for pid in (cg / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
        deadline = time.monotonic() + 5
        while True:
            try:
                cg.rmdir()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{cg} stays busy"
                time.sleep(0.01)


def _freeze(cg: Path, on: bool) -> None:
    (cg / "cgroup.freeze").write_text("1" if on else "0")
    want = f"frozen {int(on)}"
    deadline = time.monotonic() + 5
    while want not in (cg / "cgroup.events").read_text().splitlines():
        assert time.monotonic() < deadline, f"{cg}: not {want}"
        time.sleep(0.001)


def _returns_only_after_thaw(fc: FakeCuda, cg: Path, *step: str | int) -> dict[str, object]:
    """Freeze ``cg``, start fakelock ``step`` in the background; assert it has not returned
    after 0.5 s; thaw; return its JSON line."""
    _freeze(cg, True)
    locker = _start(fc, fc.build.fakelock, *map(str, step))
    time.sleep(0.5)
    assert locker.poll() is None, f"{step} returned for a frozen process"
    thawed = time.monotonic_ns()
    _freeze(cg, False)
    out, err = locker.communicate(timeout=5)
    line: dict[str, object] = json.loads(out)
    assert isinstance(line["end_ns"], int) and line["end_ns"] >= thawed, err
    return line


@pytest.mark.root
def test_a_frozen_process_is_locked_and_unlocked_once_thawed(
    fc: FakeCuda, frozen_cgroup: Path
) -> None:
    bench = _bench(fc, "--seconds", "8", "--kernel-ns", str(MS), "--sync-every", "5")
    try:
        (frozen_cgroup / "cgroup.procs").write_text(str(bench.pid))
        _ops(fc, bench.pid, 5)
        # Measured: the real lock never returns while the target is frozen, its
        # timeout (here 300 ms) not honoured; the fake's returns once thawed.
        lock = _returns_only_after_thaw(fc, frozen_cgroup, "lock", bench.pid, 300)
        assert lock["result"] == "CUDA_SUCCESS"
        # A locked process can be frozen; its unlock too waits for the thaw.
        unlock = _returns_only_after_thaw(fc, frozen_cgroup, "unlock", bench.pid)
        assert unlock["result"] == "CUDA_SUCCESS"
        (state,) = fc.lock_steps("state", bench.pid)
        assert state["state"] == "RUNNING"
        _ops(fc, bench.pid, 1, after_ns=time.monotonic_ns())  # it runs on
        # A frozen target that dies: the lock returns as for a dead pid.
        _freeze(frozen_cgroup, True)
        locker = _start(fc, fc.build.fakelock, "lock", str(bench.pid))
        time.sleep(0.2)
        assert locker.poll() is None
        _stop(bench)
        out, _ = locker.communicate(timeout=5)
        assert json.loads(out)["result"] == "CUDA_ERROR_OPERATING_SYSTEM"
    finally:
        _stop(bench)


def test_the_activity_reader_sees_a_process_work_in_a_window_only(fc: FakeCuda) -> None:
    env = {"KREX_FAKE_GPUS": "2", "CUDA_VISIBLE_DEVICES": "1"}
    kernels = _bench(fc, "--count", "5", "--kernel-ns", str(100 * MS), **env)
    graphs = _bench(fc, "--capture", "2", "--count", "2", "--kernel-ns", str(100 * MS))
    try:
        k = _ops(fc, kernels.pid, 5)
        g = _ops(fc, graphs.pid, 4)
        src = FakeActivitySource(str(fc.state_path))
        t0, t1 = k[0].start_ns, k[-1].end_ns
        assert src.busy(1, t0, t1) == {kernels.pid: t1 - t0}
        assert src.busy(1, t0 + 50 * MS, t0 + 150 * MS) == {kernels.pid: 100 * MS}
        assert src.busy(1, t1, t1 + 10**9) == {} and src.busy(1, t0 - 10**9, t0) == {}
        # The graph launches (on GPU 0) count, as one interval each.
        busy0 = src.busy(0, g[0].start_ns, g[-1].end_ns)
        assert busy0 == {graphs.pid: g[-1].end_ns - g[0].start_ns}
    finally:
        _stop(kernels)
        _stop(graphs)


def test_every_export_makes_the_entry_check_first() -> None:
    missing = []
    for path in sorted(HERE.glob("*.c")):
        text = path.read_text()
        for m in re.finditer(r"^FC_API [^;{]*?(\w+)\([^{;]*\)\s*\{\n(.*)\n", text, re.M):
            if m.group(2).strip() != "FC_ENTRY();":
                missing.append(f"{path.name}: {m.group(1)}")
    assert not missing
    assert (
        len(re.findall(r"^FC_API ", "".join(p.read_text() for p in HERE.glob("*.c")), re.M)) > 100
    )


# krexd's binding (krexd/hardware/driverlock.py) against a frozen process, in a child
# Python: lock_all with a 200 ms timeout, then thaw on "thaw" from stdin and
# report the process's state once the late lock has been undone.
BOUNDED_LOCK = """
import json, sys, time
from krexd.hardware.driverlock import DriverLock
lock = DriverLock()
pid = int(sys.argv[1])
t = time.monotonic()
(r,) = lock.lock_all([pid], 200).values()
again = lock.lock_all([pid], 200)[pid]  # its first call is still in flight
print(json.dumps({"outcome": r.outcome.value, "s": time.monotonic() - t,
                  "describe": r.describe(), "again": again.outcome.value}), flush=True)
sys.stdin.readline()  # thawed now
deadline = time.monotonic() + 5
while lock.state(pid) != "running" or lock._in_flight:
    assert time.monotonic() < deadline, lock.state(pid)
    time.sleep(0.01)
print(json.dumps({"state": lock.state(pid)}), flush=True)
"""


@pytest.mark.root
def test_krexd_s_lock_of_a_frozen_process_returns_in_bound_and_is_undone_once_late(
    fc: FakeCuda, frozen_cgroup: Path
) -> None:
    # The driver does not return from the lock of a frozen process, its timeout
    # not honoured: DriverLock.lock_all still answers (STUCK) within the timeout
    # plus LOCK_GRACE_S, makes no second call for that pid while the first is in
    # flight, and unlocks the process when the late call locks it after the thaw.
    bench = _bench(fc, "--seconds", "20", "--kernel-ns", str(MS), "--sync-every", "5")
    repo = Path(HERE).parents[1]
    try:
        (frozen_cgroup / "cgroup.procs").write_text(str(bench.pid))
        _ops(fc, bench.pid, 5)
        _freeze(frozen_cgroup, True)
        env = fc.env(
            PYTHONPATH=f"{repo}:{repo / 'python_client'}",
            KREX_DRIVER_LIB=str(fc.build.lib_dir / "libcuda.so.1"),
        )
        child = subprocess.Popen(
            [sys.executable, "-c", BOUNDED_LOCK, str(bench.pid)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        first = json.loads(child.stdout.readline() or child.stderr.read())
        assert first["outcome"] == "stuck" and first["again"] == "stuck", first
        assert first["s"] < 0.2 + 0.5 + 0.5, first  # timeout + grace, with slack
        assert f"pid {bench.pid}" in first["describe"] and "did not return" in first["describe"]
        _freeze(frozen_cgroup, False)
        child.stdin.write("thaw\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=10)
        assert json.loads(out) == {"state": "running"}, err
        assert "late, after its entry gave up; unlock: unlocked" in err, err
        _ops(fc, bench.pid, 1, after_ns=time.monotonic_ns())  # it runs on
    finally:
        _stop(bench)


def test_a_lock_whose_target_dies_leaves_the_record_s_next_owner_running(fc: FakeCuda) -> None:
    # The fake keeps a process's lock word in its record, and records are reused.
    # A lock that found its target's record, then saw the target die while the
    # record went to a new process, took the new owner's lock word: every call
    # of that process then blocked for good (seen as a drain that never ended,
    # tests/integration/test_lock_churn.py).  The pause hook holds the lock
    # between the find and the take, so the reuse happens in between every time.
    def alloc(*steps: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(fc.build.fakealloc), *steps],
            env=fc.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    target = alloc("info", "wait")  # record 0 (a fresh state)
    reclaimer = alloc("info", "wait", "info", "wait")  # record 1
    newcomer = locker = None
    try:
        for p in (target, reclaimer):
            assert p.stdout is not None
            while json.loads(p.stdout.readline())["op"] != "wait":
                pass
        # The locker lives on after its lock (as krexd does): a dead locker's
        # half-taken lock is recovered by the target's next call.
        locker = _start(
            fc, fc.build.fakelock, "lock", str(target.pid), "2000", "sleep", "4000",
            KREX_FAKE_LOCK_PAUSE_MS="1500",
        )  # fmt: skip
        time.sleep(0.5)  # the locker has found record 0 and pauses
        _stop(target)
        assert reclaimer.stdin is not None and reclaimer.stdout is not None
        reclaimer.stdin.write("\n")
        reclaimer.stdin.flush()  # its cuMemGetInfo reclaims the dead record 0
        while json.loads(reclaimer.stdout.readline())["op"] != "wait":
            pass
        newcomer = _bench(fc, "--seconds", "20", "--kernel-ns", str(MS), "--sync-every", "5")
        _ops(fc, newcomer.pid, 3)  # it runs, in record 0
        assert locker.stdout is not None
        lock = json.loads(locker.stdout.readline())
        assert lock["result"] == "CUDA_ERROR_OPERATING_SYSTEM", lock
        t0 = time.monotonic()
        _ops(fc, newcomer.pid, 5, after_ns=time.monotonic_ns())  # and runs on
        assert time.monotonic() - t0 < 2.0, "the newcomer was held until the locker died"
        assert locker.poll() is None, "the locker (it sleeps 4 s) still lives"
        (state,) = fc.lock_steps("state", newcomer.pid)
        assert state["state"] == "RUNNING"
    finally:
        for p in (target, reclaimer, newcomer, locker):
            if p is not None:
                _stop(p)
