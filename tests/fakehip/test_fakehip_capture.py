"""Stream capture and graphs through HIP: captured work is recorded, not run;
hipGraphLaunch runs it back to back; calls a capture forbids fail with HIP's
codes and invalidate it."""

from __future__ import annotations

from .harness import FakeHip

MS = 1_000_000


def test_capture_records_and_graph_launch_replays_back_to_back(fh: FakeHip) -> None:
    res = fh.python_json(
        """
import json, hipgpu
g = hipgpu.init()
s = g.stream_create()
g.begin_capture(s)
status = g.capture_status(s)
for d in (10_000_000, 20_000_000, 30_000_000):
    g.launch(d, s)
graph = g.end_capture(s)
after = g.capture_status(s)
x = g.instantiate(graph)
g.graph_launch(x, s)
g.graph_launch(x, None)       # on the null stream too
g.synchronize()
g.hip.call("hipGraphExecDestroy", x)
g.hip.call("hipGraphDestroy", graph)
print(json.dumps([status, after]))
"""
    )
    assert res == ["active", "none"]
    recs = fh.records()
    assert len(recs) == 6, "captured kernels were not run, each launch ran all three"
    assert {r.kind for r in recs} == {"G"} and all(r.captured for r in recs)
    assert [r.duration_ns for r in recs] == [10 * MS, 20 * MS, 30 * MS] * 2
    first, second = recs[:3], recs[3:]
    assert first[0].stream != 0 and {r.stream for r in second} == {0}
    for a, b in zip(recs, recs[1:], strict=False):
        assert b.start_ns >= a.end_ns
    assert first[1].start_ns == first[0].end_ns and first[2].start_ns == first[1].end_ns
    # The null stream waits for the blocking stream the first launch ran on.
    assert second[0].start_ns == first[2].end_ns


def test_unsafe_calls_during_capture_fail_with_hip_codes(fh: FakeHip) -> None:
    res = fh.python_json(
        """
import ctypes, json, hipgpu
g = hipgpu.init()
s = g.stream_create()
out = {}
g.begin_capture(s)
g.launch(1_000_000, s)
out["device_sync"] = g.hip.try_call("hipDeviceSynchronize")
out["status"] = g.capture_status(s)
graph = ctypes.c_void_p()
out["end"] = g.hip.try_call("hipStreamEndCapture", s, ctypes.byref(graph))
buf = g.malloc(64)
g.begin_capture(s)
out["malloc"] = g.hip.try_call("hipMalloc", ctypes.byref(ctypes.c_void_p()), 64)
g.hip.try_call("hipStreamEndCapture", s, ctypes.byref(graph))
g.begin_capture(s)
out["null_stream_work"] = g.hip.try_call("hipMemset", buf, 0, 64)
out["end2"] = g.hip.try_call("hipStreamEndCapture", s, ctypes.byref(graph))
out["null_capture"] = g.hip.try_call("hipStreamBeginCapture", None, 0)
g.begin_capture(s)
out["host_fn"] = g.hip.try_call("hipLaunchHostFunc", s, hipgpu.HOST_FN(lambda a: None), None)
out["end3"] = g.hip.try_call("hipStreamEndCapture", s, ctypes.byref(graph))
out["names"] = [g.hip.error_name(c) for c in (900, 901, 906)]
print(json.dumps(out))
"""
    )
    assert res["device_sync"] == 900 and res["status"] == "invalidated"
    assert res["end"] == 901
    assert res["malloc"] == 900  # hipMalloc during a global capture
    assert res["null_stream_work"] == 906 and res["end2"] == 901
    assert res["null_capture"] == 900
    assert res["host_fn"] == 900 and res["end3"] == 901
    assert res["names"] == [
        "hipErrorStreamCaptureUnsupported",
        "hipErrorStreamCaptureInvalidated",
        "hipErrorStreamCaptureImplicit",
    ]
    assert fh.records() == [], "nothing captured ran"


def test_hipbench_graph_mode(fh: FakeHip) -> None:
    out = fh.hipbench("--mode", "graph", "--capture", "4", "--count", "3", "--kernel-ns", str(MS))
    assert out["graph_launches"] == 3 and out["kernels"] == 12
    recs = fh.records()
    assert len(recs) == 12 and all(r.kind == "G" and r.captured for r in recs)
