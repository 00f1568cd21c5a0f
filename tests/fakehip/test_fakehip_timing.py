"""The simulated device's timing through HIP: sleeping synchronization, work
that keeps running while its process is frozen, copy and memset durations,
queries, events and host functions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .harness import FakeHip

MS = 1_000_000


@pytest.mark.parametrize("sync", ["device", "stream"])
def test_synchronize_sleeps_without_cpu(fh: FakeHip, sync: str) -> None:
    # hipbench ends with hipDeviceSynchronize; --sync-every 1 adds hipStreamSynchronize.
    args = ["--count", "1", "--kernel-ns", str(500 * MS)]
    out = fh.hipbench(*args, *(["--sync-every", "1"] if sync == "stream" else []))
    [k] = fh.records()
    assert k.pid == out["pid"] and k.duration_ns == 500 * MS
    assert out["end_ns"] >= k.end_ns
    assert out["syncs"] == (1 if sync == "stream" else 0)
    # Whole process, start-up included: far below the 500 ms it waited.
    assert out["cpu_ns"] < 100 * MS, f"waiting used {out['cpu_ns'] / MS:.1f} ms of CPU"


def test_frozen_process_work_still_runs(fh: FakeHip) -> None:
    code = """
import json, sys, time, hipgpu
g = hipgpu.init()
s = g.stream_create()
t0 = time.monotonic_ns()
for _ in range(3):
    g.launch(200_000_000, s)
print(json.dumps({"enqueued": t0}), flush=True)
sys.stdin.readline()            # frozen meanwhile, then told to go on
t = time.monotonic_ns()
g.stream_synchronize(s)
print(json.dumps({"sync_ns": time.monotonic_ns() - t}), flush=True)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=fh.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    t0 = json.loads(proc.stdout.readline())["enqueued"]
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(0.8)  # past the end of the 600 ms of work
        recs = fh.records()
        assert len(recs) == 3, "the intervals were written when the work was enqueued"
        assert recs[0].start_ns >= t0 and recs[-1].end_ns - recs[0].start_ns == 600 * MS
        assert time.monotonic_ns() > recs[-1].end_ns
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    waited = json.loads(proc.stdout.readline())["sync_ns"]
    assert proc.wait(timeout=30) == 0
    assert waited < 50 * MS, "the work ended while the process was frozen"


def test_copies_and_memsets_take_bytes_over_bandwidth(fh: FakeHip) -> None:
    res = fh.python_json(
        """
import ctypes, json, time, hipgpu
g = hipgpu.init()
n = 10_000_000
host = ctypes.create_string_buffer(b"x" * n, n)
back = ctypes.create_string_buffer(n)
a, b = g.malloc(n), g.malloc(n)
s = g.stream_create()
g.memcpy(a, ctypes.addressof(host), n, "h2d")            # synchronous, 50 GB/s
g.memcpy(b, a, n, "d2d", stream=s)                        # 1 TB/s
g.hip.call("hipMemsetAsync", a, 0, n, s)                  # 1 TB/s
g.stream_synchronize(s)
t = time.monotonic_ns()
g.memcpy(ctypes.addressof(back), b, n, "default")         # found to be device-to-host
after = time.monotonic_ns()
g.free(a); g.free(b)
print(json.dumps({"ok": back.raw == host.raw, "t": t, "after": after}))
"""
    )
    assert res["ok"], "data really moves"
    h2d, d2d, memset, d2h = fh.records()
    assert [r.kind for r in (h2d, d2d, memset, d2h)] == ["C", "C", "S", "C"]
    assert h2d.duration_ns == 10_000_000 // 50
    assert d2d.duration_ns == memset.duration_ns == 10_000_000 // 1000
    assert d2h.duration_ns == 10_000_000 // 50
    assert res["after"] >= d2h.end_ns, "a synchronous copy returns when it has ended"


def test_sync_memset_waits_async_does_not(fh: FakeHip) -> None:
    res = fh.python_json(
        """
import json, time, hipgpu
g = hipgpu.init()
n = 60_000_000_000                            # 60 ms at 1 TB/s (zeros: no page is touched)
p = g.malloc(n)
t0 = time.monotonic_ns()
g.hip.call("hipMemsetAsync", p, 0, n, None)
t1 = time.monotonic_ns()
g.hip.call("hipMemset", p, 0, n)
t2 = time.monotonic_ns()
print(json.dumps([t0, t1, t2]))
"""
    )
    t0, t1, t2 = res
    first, second = fh.records()
    assert first.duration_ns == second.duration_ns == 60 * MS
    assert t1 - t0 < 30 * MS, "hipMemsetAsync returns before the fill ends"
    assert t2 >= second.end_ns and second.start_ns == first.end_ns


def test_queries_events_and_host_functions_follow_the_clock(fh: FakeHip) -> None:
    res = fh.python_json(
        """
import json, time, hipgpu
g = hipgpu.init()
s = g.stream_create()
e0, e1 = g.event_create(), g.event_create()
ran = []
g.launch(200_000_000, s)
g.event_record(e0, s)
g.host_func(lambda: ran.append(time.monotonic_ns()), s)
g.launch(80_000_000, s)
g.event_record(e1, s)
busy = [g.stream_query(s), g.event_query(e1), len(ran)]
g.event_synchronize(e1)
done = [g.stream_query(s), g.event_query(e1), len(ran)]
print(json.dumps({"busy": busy, "done": done, "ms": g.event_elapsed_ms(e0, e1),
                  "ran": ran}))
"""
    )
    first, second = fh.records()
    assert res["busy"] == [False, False, 0]
    assert res["done"] == [True, True, 1]
    assert res["ms"] == 80.0  # e0 completes as the first kernel ends, the second starts then
    assert res["ran"][0] >= first.end_ns, "the host function ran when its stream reached it"


def test_checkpoint_lock_drains_a_hip_process(fh: FakeHip) -> None:
    code = """
import json, sys, hipgpu
g = hipgpu.init()
g.launch(300_000_000)
print("{}", flush=True)
sys.stdin.readline()
g.synchronize()
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=fh.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdout.readline()
        lock, state, unlock = fh.lock_steps("lock", proc.pid, "state", proc.pid, "unlock", proc.pid)
        [k] = fh.records()
        assert lock["result"] == "CUDA_SUCCESS" and lock["end_ns"] >= k.end_ns
        assert state["state"] == "LOCKED" and unlock["result"] == "CUDA_SUCCESS"
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
    assert proc.wait(timeout=30) == 0
