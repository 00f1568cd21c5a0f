"""The timeline of the fake HIP runtime: the fake CUDA driver's format, every
process's kernels with their intervals, one stream never overlapping itself,
the null stream's ordering, and HIP and CUDA tenants on one simulated GPU."""

from __future__ import annotations

import subprocess

import pytest

from tests.fakecuda import timeline

from .harness import FakeHip

MS = 1_000_000


@pytest.mark.parametrize("mode", ["launch", "module", "graph"])
def test_two_processes_kernels_appear_with_their_intervals(fh: FakeHip, mode: str) -> None:
    procs = [
        fh.hipbench_proc("--mode", mode, "--count", "20", "--kernel-ns", str(5 * MS))
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    recs = timeline.read(fh.timeline_path)  # the fake CUDA driver's parser reads it
    per_pid = timeline.by_pid(recs)
    assert sorted(per_pid) == sorted(p.pid for p in procs)
    kind = "G" if mode == "graph" else "K"
    for out, proc in zip(outs, procs, strict=True):
        rs = per_pid[proc.pid]
        assert len(rs) == 20 and {r.kind for r in rs} == {kind}
        assert {r.captured for r in rs} == {mode == "graph"}
        assert all(r.duration_ns == 5 * MS for r in rs)
        for a, b in zip(rs, rs[1:], strict=False):
            assert b.start_ns >= a.end_ns, "one stream's kernels never overlap"
        assert f'"pid": {proc.pid}' in out


def test_one_stream_runs_back_to_back_and_streams_overlap(fh: FakeHip) -> None:
    fh.python_json(
        """
import hipgpu
g = hipgpu.init()
s1, s2 = g.stream_create(), g.stream_create()
for _ in range(3):
    g.launch(100_000_000, s1)
g.launch(100_000_000, s2)
g.synchronize()
print("{}")
"""
    )
    by_stream = timeline.by_stream(fh.records())
    (a, b, c), (d,) = sorted(by_stream.values(), key=len, reverse=True)
    assert b.start_ns == a.end_ns and c.start_ns == b.end_ns
    assert a.stream != d.stream
    assert d.start_ns < a.end_ns and a.start_ns < d.end_ns, "different streams overlap"


def test_null_stream_orders_with_blocking_streams(fh: FakeHip) -> None:
    fh.python_json(
        """
import hipgpu
g = hipgpu.init()
s1, s2 = g.stream_create(), g.stream_create()
nb = g.stream_create(nonblocking=True)
g.launch(200_000_000, s1)
g.launch(10_000_000)           # null stream: waits for s1
g.launch(10_000_000, s2)       # blocking stream: waits for the null stream
g.launch(10_000_000, nb)       # hipStreamNonBlocking: waits for nothing
g.synchronize()
print("{}")
"""
    )
    s1, null, s2, nb = fh.records()  # file order = launch order within one process
    assert null.stream == 0 and s1.stream != 0
    assert null.start_ns == s1.end_ns
    assert s2.start_ns == null.end_ns
    assert nb.start_ns < s1.end_ns


def test_hip_and_cuda_tenants_share_one_simulated_gpu(fh: FakeHip) -> None:
    hip = fh.hipbench_proc("--count", "25", "--kernel-ns", str(20 * MS))
    cuda = subprocess.Popen(
        [str(fh.build.fakebench), "--count", "25", "--kernel-ns", str(20 * MS)],
        env=fh.env(),
        stdout=subprocess.DEVNULL,
    )
    assert hip.wait(timeout=60) == 0 and cuda.wait(timeout=60) == 0
    per_pid = timeline.by_pid(fh.records())
    assert sorted(per_pid) == sorted([hip.pid, cuda.pid])
    assert [len(rs) for rs in per_pid.values()] == [25, 25]
    hip_span = (per_pid[hip.pid][0].start_ns, per_pid[hip.pid][-1].end_ns)
    # Nothing keeps them apart: the CUDA tenant's kernels run inside the HIP tenant's span.
    assert timeline.overlapping(per_pid[cuda.pid], *hip_span)
