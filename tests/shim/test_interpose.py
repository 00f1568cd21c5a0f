"""The shim over the fake driver, under LD_PRELOAD as tenants run it.

* lookups land on the hooks through dlsym and cuGetProcAddress_v2 (and its
  self-lookup), keeping the driver's choice of _v2/_ptsz/_ptds;
* dlsym(RTLD_NEXT, ...) still resolves relative to its real caller;
* siblings reaching the driver by direct linking, dlopen+dlsym and
  cuGetProcAddress stop launching while a gate is closed (fake timeline);
* the drainer waits for queued work, keeps an open capture valid, and lets
  launches into a capturing stream pass a closed gate;
* fork, exec, pass-through and memory accounting.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from krexd.gate import ABI_VERSION, LIVE_REGISTRATION_STATES, Gate
from tests.fakecuda import timeline
from tests.fakecuda.harness import FakeCuda
from tests.fakehip.harness import FakeHip
from tests.support import GpuApi, json_lines, tenant_env

from .procs import CuTenant, RegionTenant, ShimBuild, wait_for

HOLDER = 1


def shim_env(fc: FakeCuda, shim: ShimBuild, gate: Gate | None, tenant: int = 2) -> dict[str, str]:
    """A tenant's environment (interfaces.md): the shim preloaded, the gate and tenant id."""
    env = fc.env(LD_PRELOAD=str(shim.shim))
    if gate is not None:
        env.update(tenant_env(gate, tenant))
    return env


@pytest.fixture
def tenants(shim_build: ShimBuild) -> Iterator[Callable[[dict[str, str]], CuTenant]]:
    started: list[CuTenant] = []

    def start(env: dict[str, str]) -> CuTenant:
        t = CuTenant(shim_build, env)
        started.append(t)
        return t

    yield start
    for t in started:
        t.close()


def records_of(fc: FakeCuda, pid: int) -> list[timeline.Record]:
    return timeline.by_pid(fc.records()).get(pid, [])


# ---- how lookups reach the hooks ---------------------------------------------------


def run_routes(shim: ShimBuild, env: dict[str, str]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(shim.prog("cu_routes"))], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout)


def test_lookups_route_to_hooks(shim_build: ShimBuild, fc: FakeCuda) -> None:
    """Every lookup of a hooked name lands in the shim on the export the driver chose."""
    bare = run_routes(shim_build, fc.env())
    shimmed = run_routes(shim_build, fc.env(LD_PRELOAD=str(shim_build.shim)))
    assert len(bare) == len(shimmed) > 40
    hooked = {
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuMemcpyHtoD_v2",
        "cuMemAlloc_v2",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuInit",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuMemcpyHtoD_v2_ptds",
        "cuMemsetD8Async",
        "cuMemsetD8Async_ptsz",
        "cuCtxCreate_v3",
        "cuCtxCreate_v4",
        "cuStreamBeginCapture_v2",
        "cuStreamBeginCapture_v2_ptsz",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
        "cuEventRecord",
        "cuEventRecord_ptsz",
    }
    seen_hooked = set()
    for b, s in zip(bare, shimmed, strict=True):
        key = (b["how"], b["base"], b["version"], b["per_thread"])
        assert key == (s["how"], s["base"], s["version"], s["per_thread"])
        assert s["status"] == b["status"], key  # symbolStatus / rc as the driver said
        if b["how"] == "dlsym_default" or b["how"] == "dlsym_next":
            continue
        assert s["symbol"] == b["symbol"], key  # the driver's choice of export is kept
        if b["symbol"] in hooked:
            assert b["object"] == "libcuda.so.1" and s["object"] == "libkrex_shim.so", key
            seen_hooked.add(b["symbol"])
        else:
            assert s["object"] == b["object"], key  # unhooked: the driver's own pointer
    assert seen_hooked == hooked
    by_key = {(s["how"], s["base"], s["version"]): s for s in shimmed if not s["per_thread"]}
    # The self-lookup returns our resolver of the arity the driver chose.
    assert by_key[("self", "cuGetProcAddress", 13000)]["symbol"] == "cuGetProcAddress_v2"
    assert by_key[("self", "cuGetProcAddress", 11030)]["symbol"] == "cuGetProcAddress"
    assert by_key[("procaddr4", "cuLaunchKernel", 4000)]["object"] == "libkrex_shim.so"
    # Not-found stays not found; RTLD_DEFAULT finds the exported hooks.
    assert by_key[("procaddr", "cuNoSuchFunction", 2000)]["status"] == 500
    assert by_key[("dlsym_default", "cuLaunchKernel", 0)]["object"] == "libkrex_shim.so"
    assert by_key[("dlsym_next", "open", 0)]["object"].startswith("libc.so")


def test_rtld_next_keeps_the_caller(shim_build: ShimBuild) -> None:
    env = dict(os.environ, LD_PRELOAD=str(shim_build.shim))
    out = subprocess.run(
        [str(shim_build.prog("dl_next"))], env=env, capture_output=True, text=True, timeout=10
    )
    assert out.returncode == 0 and out.stdout.strip() == "next=b", out


# ---- siblings stop while the gate is closed -------------------------------------------

LINKS = [
    ("direct",),
    ("dlsym",),
    ("procaddr",),
    ("procaddr", "--per-thread"),
    ("direct", "--per-thread"),
]


@pytest.mark.serial  # five siblings must all be running at the closure: a quiet host
def test_siblings_stop_while_gate_closed(shim_build: ShimBuild, fc: FakeCuda, gate: Gate) -> None:
    procs = []
    for i, link in enumerate(LINKS):
        env = shim_env(fc, shim_build, gate, tenant=2 + i)
        procs.append(
            subprocess.Popen(
                [
                    str(fc.build.fakebench),
                    "--link",
                    link[0],
                    *link[1:],
                    "--seconds",
                    "4",  # long enough that none ends before the slowest starts, on a busy machine
                    "--kernel-ns",
                    "100000",
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        wait_for(
            lambda: all(records_of(fc, p.pid) for p in procs),
            timeout=10,
            what="every sibling launching",
        )
        t_close = time.monotonic_ns()
        gate.close(HOLDER, 11)
        acked = gate.wait_drained(HOLDER, 11, 10.0)
        t_ack = time.monotonic_ns()
        time.sleep(0.4)
        t_reopen = time.monotonic_ns()
        gate.reopen(HOLDER, 11)
        outs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert len(acked) == len(LINKS)
    recs = fc.records()
    for p, (out, err), link in zip(procs, outs, LINKS, strict=True):
        assert p.returncode == 0, (link, err)
        summary = json.loads(out)
        mine = timeline.by_pid(recs)[p.pid]
        assert summary["kernels"] == len(mine)
        # No kernel of a sibling runs between the acknowledgement and the reopen.
        assert timeline.overlapping(mine, t_ack, t_reopen) == [], link
        assert any(r.end_ns <= t_close for r in mine), link
        assert any(r.start_ns >= t_reopen for r in mine), link
        assert max(r.end_ns for r in mine if r.start_ns < t_ack) <= t_ack, link
    for s in gate.registrations():
        if s.state == "active":
            assert s.ack_epoch == 11 and s.blocked_calls >= 1 and s.gated_calls > 10


# ---- what the drainer does -------------------------------------------------------------


@pytest.mark.parametrize("context", ["primary", "ctx"])
def test_drain_waits_for_queued_work(
    shim_build: ShimBuild,
    fc: FakeCuda,
    gate: Gate,
    tenants: Callable[[dict[str, str]], CuTenant],
    context: str,
) -> None:
    t = tenants(shim_env(fc, shim_build, gate))
    t.run("init" + (" ctx" if context == "ctx" else ""))
    t.run("stream 1")
    t.run("launch 1 20 10000000")  # 200 ms queued, not synchronized
    gate.close(HOLDER, 2)
    t0 = time.monotonic_ns()
    gate.wait_drained(HOLDER, 2, 10.0)
    t_ack = time.monotonic_ns()
    last_end = max(r.end_ns for r in records_of(fc, t.pid))
    assert t_ack >= last_end, "acknowledged before the queued kernels ended"
    assert t_ack - t0 > 100_000_000
    gate.reopen(HOLDER, 2)


def test_capture_survives_drain(
    shim_build: ShimBuild,
    fc: FakeCuda,
    gate: Gate,
    tenants: Callable[[dict[str, str]], CuTenant],
) -> None:
    """A drain during an open GLOBAL capture synchronizes per stream and keeps the capture."""
    t = tenants(shim_env(fc, shim_build, gate))
    t.run("init")
    t.run("stream 1")
    t.run("stream 2")
    t.run("begin 1 global")
    t.run("launch 1 5 1000000")  # captured, not executed
    t.run("launch 2 10 10000000")  # 100 ms of real work on another stream
    assert gate.registrations()[0].captures == 1
    gate.close(HOLDER, 4)
    gate.wait_drained(HOLDER, 4, 10.0)
    t_ack = time.monotonic_ns()
    work = [r for r in records_of(fc, t.pid) if not r.captured]
    assert len(work) == 10 and max(r.end_ns for r in work) <= t_ack
    gate.reopen(HOLDER, 4)
    t.run("end 1")  # 901 (invalidated) if the drainer had synchronized the context
    t.run("graph 1")
    t.run("sync 1")
    assert len([r for r in records_of(fc, t.pid) if r.captured]) == 5
    assert gate.registrations()[0].captures == 0


def test_capturing_launch_passes_closed_gate(
    shim_build: ShimBuild,
    fc: FakeCuda,
    gate: Gate,
    tenants: Callable[[dict[str, str]], CuTenant],
) -> None:
    t = tenants(shim_env(fc, shim_build, gate))
    t.run("init")
    t.run("stream 1")
    t.run("stream 2")
    t.run("begin 1 global")
    gate.close(HOLDER, 5)
    gate.wait_drained(HOLDER, 5, 10.0)
    r = t.run("launch 1 50 1000")  # into the capture: passes, uncounted
    assert r["t1"] - r["t0"] < 500_000_000
    t.send("launch 2 1 1000")  # real work: parks
    time.sleep(0.3)
    assert t.pending(), "a launch passed the closed gate"
    t_reopen = time.monotonic_ns()
    gate.reopen(HOLDER, 5)
    r = t.reply()
    assert r["rc"] == 0 and r["t1"] >= t_reopen
    t.run("end 1")


def test_holder_region_begin_end(
    gpu_api: GpuApi, fh: FakeHip, gate: Gate, region_tenants: Callable[..., RegionTenant]
) -> None:
    """The holder's own calls pass; region_begin flushes L2, region_end waits for side work.
    Over HIP the flush is a HIP memset of the device's L2 and the exit a HIP drain."""
    holder = region_tenants(HOLDER)
    holder.run("init")
    side = holder.stream(nonblocking=True)
    gate.close(HOLDER, 3)
    gate.wait_drained(HOLDER, 3, 5.0)
    b = holder.run("region_begin 3 1")
    flush = [r for r in records_of(fh, holder.pid) if r.kind == timeline.MEMSET]
    assert len(flush) == 1 and b["t0"] <= flush[0].start_ns and flush[0].end_ns <= b["t1"]
    assert b["flushed"] == 1  # the record says what happened
    # The fake device moves bytes at 1 TB/s: the memset covered the whole L2.
    assert abs(flush[0].duration_ns - gpu_api.l2_bytes / 1e3) < 2000
    holder.launch(side, 5, 20_000_000)  # 100 ms left running on a side stream
    e = holder.run("region_end")
    kernels = [r for r in records_of(fh, holder.pid) if r.kind == timeline.KERNEL]
    assert e["launches"] == 5
    assert e["t1"] >= max(r.end_ns for r in kernels)
    assert e["sync_ns"] >= 50_000_000
    holder.run("region_begin 3 1")  # the buffer is reused: no second allocation
    gate.reopen(HOLDER, 3)


def test_region_runs_unflushed_when_the_gpu_has_no_room_for_the_flush_buffer(
    gpu_api: GpuApi, fh: FakeHip, gate: Gate, region_tenants: Callable[..., RegionTenant]
) -> None:
    """Frozen siblings keep their memory: a full GPU skips the flush, the region goes on."""
    # The L2-sized buffer cannot fit.
    holder = region_tenants(HOLDER, KREX_FAKE_MEM_BYTES=str(gpu_api.l2_bytes // 2))
    holder.run("init")
    gate.close(HOLDER, 5)
    gate.wait_drained(HOLDER, 5, 5.0)
    b = holder.run("region_begin 5 1")
    assert b["rc"] == 0
    assert b["flushed"] == 0  # asked for, not done: the record must not claim it
    if gpu_api.name == "hip":
        # The flush's failed hipMalloc is the shim's, not the program's next hipGetLastError.
        assert b["last_error"] == 0, b
    assert not [r for r in records_of(fh, holder.pid) if r.kind == timeline.MEMSET]
    holder.launch(0, 2, 1_000_000)
    e = holder.run("region_end")
    assert e["launches"] == 2
    gate.reopen(HOLDER, 5)


# ---- process lifecycle and pass-through -------------------------------------------------

FORK_CODE = r"""
import ctypes, os, sys, time
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
pid = os.fork()
if pid == 0:
    cu.cuInit(0)  # the child registers on its first gated call (the driver refuses it)
    os.write(1, b"%d\n" % os.getpid())  # one write: lines of the two processes stay whole
    time.sleep(30)
    os._exit(0)
os.write(1, b"%d\n" % os.getpid())
time.sleep(30)
"""


def test_fork_child_registers_its_own_slot(shim_build: ShimBuild, fc: FakeCuda, gate: Gate) -> None:
    env = shim_env(fc, shim_build, gate)
    p = subprocess.Popen(
        [sys.executable, "-c", FORK_CODE], env=env, stdout=subprocess.PIPE, text=True
    )
    pids: set[int] = set()
    try:
        assert p.stdout is not None
        pids = {int(p.stdout.readline()), int(p.stdout.readline())}
        assert p.pid in pids
        wait_for(
            lambda: {s.pid for s in gate.registrations() if s.state == "active"} == pids,
            what="parent and child slots",
        )
        gate.close(HOLDER, 1)
        assert len(gate.wait_drained(HOLDER, 1, 5.0)) == 2  # both have drainers
        gate.reopen(HOLDER, 1)
    finally:
        for pid in pids - {p.pid}:  # the forked child, by its pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()
        p.wait()


EXEC_CODE = """
import ctypes, os, sys
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
print(os.getpid(), flush=True)
sys.stdin.readline()
os.execv(sys.executable, [sys.executable, "-c", "import sys; print('new', flush=True); "
                          "sys.stdin.readline()"])
"""


def test_exec_releases_the_slot(shim_build: ShimBuild, fc: FakeCuda, gate: Gate) -> None:
    env = shim_env(fc, shim_build, gate)
    p = subprocess.Popen(
        [sys.executable, "-c", EXEC_CODE],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        pid = int(p.stdout.readline())
        assert [s.state for s in gate.registrations() if s.pid == pid] == ["active"]
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "new"
        # The new image (same pid, no drainer) released the old slot at start.
        assert [s.state for s in gate.registrations() if s.pid == pid] == []
        gate.close(HOLDER, 1)
        assert gate.wait_drained(HOLDER, 1, 2.0) == []
        gate.reopen(HOLDER, 1)
    finally:
        p.kill()
        p.wait()


def test_pass_through_without_gate(shim_build: ShimBuild, fc: FakeCuda) -> None:
    summary = fc.bench(
        "--link",
        "procaddr",
        "--count",
        "20",
        "--kernel-ns",
        "1000",
        env=shim_env(fc, shim_build, None),
    )
    assert summary["kernels"] == 20 and summary["error"] is None
    code = "import ctypes; print(ctypes.CDLL(None).krex_shim_active())"
    active = fc.python(code, env=shim_env(fc, shim_build, None))
    assert active.stdout.strip() == "0"


def refused(fc: FakeCuda, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run fakebench under ``env``; it must get no GPU work done.  (result, the shim's lines)."""
    out = subprocess.run(
        [str(fc.build.fakebench), "--link", "dlsym", "--count", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert '"kernels": 5' not in out.stdout, out.stdout
    return out, "\n".join(ln for ln in out.stderr.splitlines() if "krex-shim" in ln)


def test_an_unusable_gate_fails_closed(shim_build: ShimBuild, fc: FakeCuda, tmp_path: Path) -> None:
    """Under krex (KREX_GATE set), a gate the shim cannot map refuses GPU work: never ungated."""
    env = shim_env(fc, shim_build, None)
    env.update(KREX_GATE=str(tmp_path / "missing.gate"), KREX_TENANT="2")
    _, lines = refused(fc, env)
    assert "missing.gate" in lines and "GPU work refused" in lines and "pass-through" not in lines


@pytest.mark.root  # makes a gate the shim maps (root-owned only)
def test_a_gate_of_another_layout_version_is_refused_by_name(
    shim_build: ShimBuild, fc: FakeCuda, tmp_path: Path
) -> None:
    path = tmp_path / "old.gate"
    Gate.create(str(path), 0).unmap()
    with open(path, "r+b") as f:  # the version field: bytes 8..11 of every version
        f.seek(8)
        f.write((2).to_bytes(4, "little"))
    env = shim_env(fc, shim_build, None)
    env.update(KREX_GATE=str(path), KREX_TENANT="2")
    _, lines = refused(fc, env)
    assert "old.gate" in lines and (
        f"gate layout version 2, this libkrex_shim.so expects {ABI_VERSION}" in lines
    )


def test_no_slot_memory_fails_closed(shim_build: ShimBuild, fc: FakeCuda, gate: Gate) -> None:
    """A tenant process without its slot memory (or someone else's) refuses GPU work."""
    env = shim_env(fc, shim_build, None)
    env.update(KREX_GATE=gate.path, KREX_TENANT="2")
    _, lines = refused(fc, env)
    assert "slot memory" in lines and "GPU work refused" in lines
    env.update(tenant_env(gate, 3))
    env["KREX_TENANT"] = "2"  # tenant 3's slot memory, claimed as tenant 2
    _, lines = refused(fc, env)
    assert "not this tenant's" in lines


def test_allocations_pass_and_the_shim_is_active(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate
) -> None:
    """Allocations and frees pass through the shim; it reports itself active.  (Their
    accounting is the slot's, ``tests/memory/test_shim_oom.py``.)"""
    code = """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
me = ctypes.CDLL(None)
assert cu.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
ptr = ctypes.c_uint64()
for n in (1 << 20, 3 << 20):
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
assert cu.cuMemFree_v2(ptr) == 0
print(json.dumps([me.krex_shim_active(), hasattr(me, "krex_shim_mem_stats")]))
"""
    assert fc.python_json(code, env=shim_env(fc, shim_build, gate)) == [1, False]


def test_driver_called_from_a_library_constructor(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate
) -> None:
    """A library's constructor reaches the hooks before main(), gated and registered."""
    out = subprocess.run(
        [str(shim_build.prog("dl_ctor"))],
        env=shim_env(fc, shim_build, gate),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and out.stdout.strip() == "init=0 active=1", out
    # Exited: the slot stays registered (EXITING after the exit handler) until reclaimed.
    mine = [s for s in gate.registrations() if s.state in LIVE_REGISTRATION_STATES]
    assert len(mine) == 1 and mine[0].gated_calls >= 1


def test_warm_up_runs_only_inside_the_holders_region(
    gpu_api: GpuApi, fh: FakeHip, gate: Gate, region_tenants: Callable[..., RegionTenant]
) -> None:
    """krex_shim_region_warm: refused outside the holder's region; inside, memsets of the
    L2 flush buffer through the process's runtime (HIP's over HIP) for about the budget,
    counted as no launch."""
    t = region_tenants(HOLDER)
    t.run("init")
    assert t.run("region_warm 5000")["spent"] == -800  # CUDA_ERROR_NOT_PERMITTED
    gate.close(HOLDER, 2)
    gate.wait_drained(HOLDER, 2, 5.0)
    t.run("region_begin 2 1")
    w = t.run("region_warm 20000")
    # Within the call, and at most the budget and host noise on a loaded machine (short
    # of it when a preempted batch makes one more memset look too long to fit: how close
    # it comes is tests/cli/test_region_warm.py's, through the client's slices).
    assert 0 < w["spent"] * 1000 <= w["t1"] - w["t0"] and w["spent"] < 80_000, w
    e = t.run("region_end")
    gate.reopen(HOLDER, 2)
    assert e["launches"] == 0
    assert t.run("region_warm 5000")["spent"] == -800
    flush, *warm = [r for r in records_of(fh, t.pid) if r.kind == timeline.MEMSET]
    assert warm and all(w["t0"] <= m.start_ns and m.end_ns <= w["t1"] for m in warm)
    for m in (flush, *warm):
        assert abs(m.duration_ns - gpu_api.l2_bytes / 1e3) < 2000, m


def test_region_begin_keeps_an_open_capture(
    fh: FakeHip, gate: Gate, region_tenants: Callable[..., RegionTenant]
) -> None:
    """With a capture open the L2 flush is skipped: it would invalidate the capture."""
    t = region_tenants(HOLDER)
    t.run("init")
    s = t.stream()
    t.capture_begin(s)
    t.launch(s, 3, 1000)
    gate.close(HOLDER, 1)
    gate.wait_drained(HOLDER, 1, 5.0)
    t.run("region_begin 1 1")
    t.run("region_end")
    gate.reopen(HOLDER, 1)
    t.capture_end(s)  # 901 if the flush or the exit synchronization had broken it
    assert [r for r in records_of(fh, t.pid) if r.kind == timeline.MEMSET] == []


def test_region_calls_without_a_driver_loaded(shim_build: ShimBuild, gate: Gate) -> None:
    """A command that never loaded the driver: region calls succeed, load nothing, say nothing."""
    code = (
        "import ctypes, json\n"
        "me = ctypes.CDLL(None)\n"
        "n, k = ctypes.c_uint64(), ctypes.c_uint64()\n"
        "b = me.krex_shim_region_begin(7, 1)\n"
        "e = me.krex_shim_region_end(ctypes.byref(n), ctypes.byref(k))\n"
        "loaded = any('libcuda' in ln for ln in open('/proc/self/maps'))\n"
        "print(json.dumps([b, e, k.value, me.krex_shim_active(), loaded]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2))
    gate.close(2, 7)  # the region this command holds
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    gate.reopen(2, 7)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [0, 0, 0, 1, False]
    assert "krex-shim" not in out.stderr
