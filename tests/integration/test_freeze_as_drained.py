"""Full stack over the fake driver: each sibling is frozen as soon as it has drained.

Real krexd, real cgroups, the real shim LD_PRELOADed by ``krex run``.  One
sibling ("slow") has a long kernel queued when the holder enters, so its
drainer acknowledges only once that kernel ended (it synchronizes first);
the other ("quick") drains at once.  While the entry waits for the slow
one, the test reads both siblings' ``cgroup.events``: the quick one must be
frozen already, the slow one not until its kernel (hence its
acknowledgement) is over.  Before the pipelining, every freeze came after
the whole drain, so the quick sibling was never seen frozen while the slow
one drained.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakecuda import timeline
from tests.support import GpuApi, scrape, value

pytestmark = [pytest.mark.root]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
SHIM = os.path.join(REPO, "build", "lib", "libkrex_shim.so")
PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")
SIBLING = os.path.join(PROGS, "launch_on_demand.py")
HOLDER = os.path.join(PROGS, "entering_holder.py")
SLOW_NS = 1_500_000_000  # the slow sibling's kernel, queued just before the entry


class Lines:
    """A child's stdout as a queue of lines (read by a thread)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.strip())

    def get(self, timeout_s: float = 30.0) -> str:
        try:
            return self._q.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"pid {self.proc.pid} said nothing in {timeout_s} s") from None

    def poll(self) -> str | None:
        try:
            return self._q.get_nowait()
        except queue.Empty:
            return None

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


def _v2_mount() -> str:
    """Where cgroup v2 is mounted (``/sys/fs/cgroup``, or ``.../unified`` on a hybrid host)."""
    with open("/proc/self/mounts") as f:
        return next(line.split()[1] for line in f if line.split()[2] == "cgroup2")


def _frozen(pid: int) -> bool:
    """``frozen`` of the cgroup that process ``pid`` is in (cgroup v2 ``cgroup.events``).

    False once the process or its cgroup is gone (an ended sibling).
    """
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            path = next(line[3:].strip() for line in f if line.startswith("0::"))
        with open(f"{_v2_mount()}{path}/cgroup.events") as f:
            return any(line.split() == ["frozen", "1"] for line in f)
    except OSError:
        return False


@dataclass
class Stack:
    env: dict[str, str]
    timeline: str
    quick: Lines
    slow: Lines
    holder: Lines
    quick_pid: int
    slow_pid: int


def _start(k: Any, procs: list[subprocess.Popen[str]], api: GpuApi) -> Stack:
    if not (os.path.exists(SHIM) and os.path.exists(os.path.join(FAKE_DIR, "libcuda.so.1"))):
        pytest.fail("build the shim and the fake driver first: make")
    env = api.env(k.env, k.workdir)
    tl = env["KREX_FAKE_TIMELINE"]

    def start(*argv: str) -> Lines:
        p = subprocess.Popen(
            [*k.krex, "run", "--", sys.executable, *argv],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        return Lines(p)

    quick, slow, holder = start(SIBLING), start(SIBLING), start(HOLDER)
    quick_pid = json.loads(quick.get())["pid"]
    slow_pid = json.loads(slow.get())["pid"]
    assert holder.get() == "ready"
    return Stack(env, tl, quick, slow, holder, quick_pid, slow_pid)


def _enter_watching(s: Stack) -> tuple[dict[str, Any], list[tuple[int, bool, bool]]]:
    """Queue the slow kernel, enter; (the holder's reply, [(ns, quick frozen, slow frozen)]),
    ns read after the two states (an upper bound of any freeze seen)."""
    s.slow.send(str(SLOW_NS))
    assert s.slow.get() == "launched"
    s.holder.send("enter")
    seen: list[tuple[int, bool, bool]] = []
    deadline = time.monotonic() + 30
    while (reply := s.holder.poll()) is None:
        assert time.monotonic() < deadline, "the holder's entry never ended"
        quick, slow = _frozen(s.quick_pid), _frozen(s.slow_pid)
        # The time after the reads: a state read as frozen was frozen by then.  (Taken
        # before them, a test descheduled between the clock and the reads dated a
        # later freeze too early.)
        seen.append((time.monotonic_ns(), quick, slow))
        time.sleep(0.0005)
    return json.loads(reply), seen


def _slow_kernel_end(s: Stack) -> int:
    return max(
        r.end_ns
        for r in timeline.read(s.timeline)
        if r.pid == s.slow_pid and r.duration_ns == SLOW_NS
    )


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.stdin is not None:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_a_drained_sibling_is_frozen_while_another_still_drains(
    krexd_factory: Any, gpu_api: GpuApi
) -> None:
    k = krexd_factory(slots=4, args=list(gpu_api.krexd_args))
    procs: list[subprocess.Popen[str]] = []
    try:
        s = _start(k, procs, gpu_api)
        reply, seen = _enter_watching(s)
        assert reply["ok"], reply
        end = _slow_kernel_end(s)
        assert reply["granted_ns"] >= end
        # The quick sibling froze while the slow one was still draining (its kernel ran) ...
        early = [t for t, quick, slow in seen if quick and not slow and t < end - 200_000_000]
        assert early, f"quick sibling never seen frozen during the slow one's drain: {seen[:5]}"
        # ... and the slow one was not frozen before it could acknowledge.
        slow_frozen = [t for t, _, slow in seen if slow]
        assert not slow_frozen or min(slow_frozen) >= end
        assert _frozen(s.quick_pid) is False and _frozen(s.slow_pid) is False  # thawed at exit
    finally:
        _stop(procs)


def test_a_drain_timeout_ends_the_overdue_sibling_and_grants(
    krexd_factory: Any, gpu_api: GpuApi
) -> None:
    # The offender pays, not its neighbours: the slow sibling holds the drain past
    # drain_timeout_s, so its command is ended (exit 79, the reason in its output);
    # the holder is granted once it has left the GPU, and the quick sibling, frozen
    # early, is thawed at the region's exit and runs on.
    # The metrics endpoint counts it (issue "Operators can see a krex host", item 4).
    metrics = {"enabled": True, "port": 0}
    region = {"drain_timeout_s": 0.5}
    config = {"region": region, "metrics": metrics}
    k = krexd_factory(slots=4, config=config, args=list(gpu_api.krexd_args))
    procs: list[subprocess.Popen[str]] = []
    try:
        s = _start(k, procs, gpu_api)
        reply, seen = _enter_watching(s)  # the slow sibling drains in 1.5 s: too late
        assert reply["ok"], reply
        assert any(quick and not slow for _, quick, slow in seen), "nothing was frozen early"
        slow = procs[1]
        assert slow.wait(30) == 79
        assert slow.stderr is None  # its reason went to krex run's stderr (the test's)
        gpu = k.status()["gpus"][0]
        assert gpu["region"]["holder"] is None, gpu
        assert gpu["region"]["regions"]["failed"] == 0
        assert "did not drain its GPU work within drain_timeout_s" in k.log()
        m = scrape(k.status()["metrics"]["port"])
        assert value(m, "krex_region_drain_timeouts_total", gpu="0") == 1
        assert value(m, "krex_commands_ended_total", gpu="0", reason="drain_timeout") == 1
        assert value(m, "krex_regions_entered_total", gpu="0") == 1
        assert not _frozen(s.quick_pid)
        s.quick.send("1000")
        assert s.quick.get(timeout_s=5) == "launched"
    finally:
        _stop(procs)
