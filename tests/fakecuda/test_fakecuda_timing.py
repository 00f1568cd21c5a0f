"""The simulated device's timing: stream order, overlap, legacy-stream
ordering, sleeping synchronization, queries, events, the launch queue."""

from __future__ import annotations

from .harness import FakeCuda
from .timeline import Record

MS = 1_000_000


def kernels(fc: FakeCuda) -> list[Record]:
    return sorted((r for r in fc.records() if r.kind == "K"), key=lambda r: r.start_ns)


def test_back_to_back_kernels_on_one_stream_queue_and_sum(fc: FakeCuda) -> None:
    t0, t1, t2 = fc.python_json(
        """
import json, time, fakegpu
g = fakegpu.init()
t0 = time.monotonic_ns()
for _ in range(5):
    g.launch(100_000_000)
t1 = time.monotonic_ns()
g.synchronize()
print(json.dumps([t0, t1, time.monotonic_ns()]))
"""
    )
    recs = kernels(fc)
    assert len(recs) == 5
    assert t0 <= recs[0].start_ns <= t1
    for a, b in zip(recs, recs[1:], strict=False):
        assert b.start_ns == a.end_ns, "one stream's kernels run back to back, never overlap"
    assert recs[-1].end_ns - recs[0].start_ns == 5 * 100 * MS
    assert t1 - t0 < 300 * MS, "launches return before the kernels run"
    assert t2 >= recs[-1].end_ns, "synchronize returns after the last kernel ends"


def test_two_streams_overlap(fc: FakeCuda) -> None:
    fc.python_json(
        """
import fakegpu
g = fakegpu.init()
s1, s2 = g.stream_create(), g.stream_create()
g.launch(200_000_000, s1)
g.launch(200_000_000, s2)
g.synchronize()
print("{}")
"""
    )
    a, b = kernels(fc)
    assert a.stream != b.stream
    assert b.start_ns < a.end_ns and a.start_ns < b.end_ns


def test_legacy_default_stream_orders_with_blocking_streams(fc: FakeCuda) -> None:
    fc.python_json(
        """
import fakegpu
g = fakegpu.init()
s1, s2 = g.stream_create(), g.stream_create()
nb = g.stream_create(nonblocking=True)
g.launch(200_000_000, s1)
g.launch(10_000_000)           # legacy stream: waits for s1
g.launch(10_000_000, s2)       # blocking stream: waits for the legacy stream
g.launch(10_000_000, nb)       # non-blocking: waits for nothing
g.synchronize()
print("{}")
"""
    )
    recs = fc.records()
    s1, legacy, s2, nb = recs  # file order = launch order within one process
    assert legacy.stream == 0 and s1.stream != 0
    assert legacy.start_ns == s1.end_ns
    assert s2.start_ns == legacy.end_ns
    assert nb.start_ns < s1.end_ns


def test_synchronize_sleeps_without_cpu(fc: FakeCuda) -> None:
    out = fc.bench("--count", "1", "--kernel-ns", str(500 * MS))
    [k] = kernels(fc)
    assert k.pid == out["pid"]
    assert out["end_ns"] >= k.end_ns
    assert out["end_ns"] - out["first_launch_ns"] >= 500 * MS
    # Whole process, start-up included: far below the 500 ms it waited.
    assert out["cpu_ns"] < 100 * MS, f"waiting used {out['cpu_ns'] / MS:.1f} ms of CPU"


def test_query_and_events_follow_the_clock(fc: FakeCuda) -> None:
    res = fc.python_json(
        """
import json, fakegpu
g = fakegpu.init()
s = g.stream_create()
e0, e1 = g.event_create(), g.event_create()
g.launch(200_000_000, s)
g.event_record(e0, s)
g.launch(80_000_000, s)
g.event_record(e1, s)
busy = [g.stream_query(s), g.event_query(e1)]
g.event_synchronize(e1)
done = [g.stream_query(s), g.event_query(e1)]
print(json.dumps({"busy": busy, "done": done, "ms": g.event_elapsed_ms(e0, e1)}))
"""
    )
    assert res["busy"] == [False, False]
    assert res["done"] == [True, True]
    # e0 completes when the first kernel ends, the second starts then: exactly 80 ms apart.
    assert res["ms"] == 80.0


def test_context_sync_from_a_thread_without_context(fc: FakeCuda) -> None:
    res = fc.python_json(
        """
import json, threading, time, fakegpu
g = fakegpu.init()
s = g.stream_create(nonblocking=True)
g.launch(100_000_000, s)
out = {}
def drainer():
    out["plain"] = g.drv.try_call("cuCtxSynchronize")       # no current context here
    out["v2"] = g.drv.try_call("cuCtxSynchronize_v2", g.ctx)
    out["t"] = time.monotonic_ns()
t = threading.Thread(target=drainer)
t.start(); t.join()
print(json.dumps(out))
"""
    )
    [k] = kernels(fc)
    assert res["plain"] == 201  # CUDA_ERROR_INVALID_CONTEXT, as measured on the real driver
    assert res["v2"] == 0
    assert res["t"] >= k.end_ns


def test_full_launch_queue_blocks_the_launch(fc: FakeCuda) -> None:
    waited_ns = fc.python_json(
        """
import json, time, fakegpu
g = fakegpu.init()
s = g.stream_create()
g.launch(600_000_000, s)
for _ in range(1023):
    g.launch(0, s)
t = time.monotonic_ns()
g.launch(0, s)                 # the 1025th operation: the queue is full
print(json.dumps(time.monotonic_ns() - t))
"""
    )
    first = kernels(fc)[0]
    assert first.duration_ns == 600 * MS
    assert waited_ns > 200 * MS


def test_work_of_a_destroyed_stream_still_counts_for_context_sync(fc: FakeCuda) -> None:
    t = fc.python_json(
        """
import json, time, fakegpu
g = fakegpu.init()
s = g.stream_create()
g.launch(100_000_000, s)
g.stream_destroy(s)
g.synchronize()
print(json.dumps(time.monotonic_ns()))
"""
    )
    [k] = kernels(fc)
    assert t >= k.end_ns
