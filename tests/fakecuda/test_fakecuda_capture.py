"""Stream capture: captured work runs only when its graph is launched, and
calls that are unsafe during a capture break it as on the real driver."""

from __future__ import annotations

from .harness import FakeCuda

CAPTURE_UNSUPPORTED = 900
CAPTURE_INVALIDATED = 901
CAPTURE_IMPLICIT = 906


def test_capture_records_nothing_until_graph_launch(fc: FakeCuda) -> None:
    out = fc.bench("--capture", "4", "--capture-only", "--kernel-ns", "1000000")
    assert out["error"] is None and out["graph_launches"] == 0
    assert fc.records() == []

    out = fc.bench("--capture", "4", "--count", "3", "--kernel-ns", "1000000")
    recs = fc.records()
    assert out["graph_launches"] == 3
    assert len(recs) == 12
    assert all(r.kind == "G" and r.captured for r in recs)
    for a, b in zip(recs, recs[1:], strict=False):
        assert b.start_ns >= a.end_ns  # one stream: launches and their nodes in order
    for i in range(3):  # each launch's four kernels run back to back
        nodes = recs[4 * i : 4 * i + 4]
        assert all(n.start_ns == p.end_ns for p, n in zip(nodes, nodes[1:], strict=False))


SCRIPT = """
import json, threading, fakegpu
g = fakegpu.init()
s = g.stream_create()
other = g.stream_create()
res = {}
def in_thread(fn):
    t = threading.Thread(target=lambda: (g.make_current(), fn()))
    t.start(); t.join()
"""


def test_sync_from_another_thread_invalidates_a_global_capture(fc: FakeCuda) -> None:
    res = fc.python_json(
        SCRIPT
        + """
g.begin_capture(s, "global")
g.launch(1_000_000, s)
in_thread(lambda: res.update(query=g.drv.try_call("cuStreamQuery", other)))
res["status"] = g.capture_status(s)
try:
    g.alloc(4096)                            # also unsafe in GLOBAL mode
except fakegpu.CudaError as e:
    res["alloc"] = e.code
try:
    g.end_capture(s)
except fakegpu.CudaError as e:
    res["end"] = e.code
print(json.dumps(res))
"""
    )
    assert res == {
        "query": CAPTURE_UNSUPPORTED,
        "status": "invalidated",
        "alloc": CAPTURE_UNSUPPORTED,
        "end": CAPTURE_INVALIDATED,
    }
    assert fc.records() == []


def test_relaxed_thread_and_thread_local_capture_are_safe(fc: FakeCuda) -> None:
    res = fc.python_json(
        SCRIPT
        + """
def relaxed_query():
    g.exchange_capture_mode("relaxed")
    res["relaxed"] = g.drv.try_call("cuStreamQuery", other)
g.begin_capture(s, "global")
g.launch(1_000_000, s)
in_thread(relaxed_query)
graph = g.end_capture(s)
g.begin_capture(s, "thread_local")
in_thread(lambda: res.update(thread_local=g.drv.try_call("cuStreamQuery", other)))
g.end_capture(s)
g.graph_launch(g.instantiate(graph), s)
g.synchronize()
print(json.dumps(res))
"""
    )
    assert res == {"relaxed": 0, "thread_local": 0}
    [r] = fc.records()
    assert r.kind == "G" and r.captured and r.duration_ns == 1_000_000


def test_context_sync_breaks_capture_in_any_mode(fc: FakeCuda) -> None:
    res = fc.python_json(
        SCRIPT
        + """
def relaxed_ctx_sync():
    g.exchange_capture_mode("relaxed")
    res["sync"] = g.drv.try_call("cuCtxSynchronize_v2", g.ctx)
g.begin_capture(s, "relaxed")
in_thread(relaxed_ctx_sync)
res["status"] = g.capture_status(s)
print(json.dumps(res))
"""
    )
    assert res == {"sync": CAPTURE_UNSUPPORTED, "status": "invalidated"}


def test_legacy_stream_work_during_blocking_capture(fc: FakeCuda) -> None:
    res = fc.python_json(
        SCRIPT
        + """
nb = g.stream_create(nonblocking=True)
g.begin_capture(nb, "global")
g.launch(1_000_000)                      # legacy stream; the capturing stream is non-blocking
res["nonblocking"] = g.capture_status(nb)
g.begin_capture(s, "global")
try:
    g.launch(1_000_000)                  # would depend on the capturing blocking stream
except fakegpu.CudaError as e:
    res["blocking"] = e.code
res["status"] = g.capture_status(s)
print(json.dumps(res))
"""
    )
    assert res == {"nonblocking": "active", "blocking": CAPTURE_IMPLICIT, "status": "invalidated"}
    [r] = fc.records()  # only the launch that was allowed ran
    assert r.kind == "K" and r.stream == 0


def test_event_wait_joins_another_stream_to_the_capture(fc: FakeCuda) -> None:
    res = fc.python_json(
        SCRIPT
        + """
e = g.event_create()
g.begin_capture(s, "global")
g.event_record(e, s)
g.stream_wait_event(other, e)
res["joined"] = g.capture_status(other)
g.launch(2_000_000, other)               # captured, not run
e2 = g.event_create()
g.event_record(e2, other)
g.stream_wait_event(s, e2)
graph = g.end_capture(s)
res["after"] = g.capture_status(other)
g.graph_launch(g.instantiate(graph), s)
g.synchronize()
print(json.dumps(res))
"""
    )
    assert res == {"joined": "active", "after": "none"}
    [r] = fc.records()
    assert r.kind == "G" and r.duration_ns == 2_000_000
