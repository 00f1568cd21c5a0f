"""The shim gates HIP (docs/design/shim.md "HIP gating"), over the fake HIP runtime.

Each test runs real processes with the shim LD_PRELOADed on the fake
``libamdhip64.so.6`` (tests/fakehip), which drives the fake CUDA driver's
simulated GPU: its timeline is the witness.  The test plays krexd's
coordinator with krexd.gate (holder 1): close, drain, hold, reopen.  The
siblings are tenant 2: ``hip_tenant.py`` (driven line by line, its calls
through ctypes: dlopen and dlsym of the runtime) and hipbench (linked, or
``--link dlsym``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from krexd.gate import FaultSeen, Gate, RegistrationInfo
from krexd.hardware.inventory import fake_amd_uuid
from krexd.tenancy.registrations import Verifier
from tests.fakecuda import timeline
from tests.fakehip.harness import FakeHip
from tests.support import ShimBuild, tenant_env

from .procs import HipTenant, wait_for

HOLDER = 1
SIBLING = 2
KERNEL_NS = 1_000_000_000


@pytest.fixture
def sibling(shim_build: ShimBuild, fh: FakeHip, gate: Gate) -> Iterator[Callable[..., HipTenant]]:
    started: list[HipTenant] = []

    def start(**extra: str) -> HipTenant:
        env = fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, SIBLING), **extra)
        t = HipTenant(env)
        started.append(t)
        return t

    yield start
    for t in started:
        t.close()


def mine(gate: Gate, pid: int) -> list[RegistrationInfo]:
    return [s for s in gate.registrations() if s.pid == pid and s.state != "free"]


def region(gate: Gate, epoch: int, hold_s: float = 0.3, timeout_s: float = 15.0) -> tuple[int, int]:
    """Close, drain, hold, reopen: the region's (start, end) in monotonic ns."""
    gate.close(HOLDER, epoch)
    gate.drain(HOLDER, epoch, timeout_s)
    start = time.monotonic_ns()
    time.sleep(hold_s)
    end = time.monotonic_ns()
    gate.reopen(HOLDER, epoch)
    return start, end


def kernels_of(fh: FakeHip, pid: int) -> list[timeline.Record]:
    return [r for r in fh.records() if r.pid == pid]


def inside(records: list[timeline.Record], span: tuple[int, int]) -> list[timeline.Record]:
    return timeline.overlapping(records, span[0], span[1])


# ---- registration ---------------------------------------------------------------------


def test_a_hip_process_registers_and_is_verified(
    gate: Gate, sibling: Callable[..., HipTenant]
) -> None:
    """Its first gated HIP call registers it; krexd's verifier finds the process behind it."""
    t = sibling()
    time.sleep(0.5)  # started, no HIP call yet
    assert mine(gate, t.pid) == []
    t.run("init")  # hipInit (class C): the first gated call
    slots = mine(gate, t.pid)
    assert len(slots) == 1, gate.registrations()
    s = slots[0]
    assert (s.state, s.tenant) == ("active", SIBLING)
    assert Verifier(lambda tenant: [t.pid] if tenant == SIBLING else None).resolve(s) == t.pid


def test_the_runtime_initializes_inside_the_gate_whatever_the_first_call(
    gate: Gate, sibling: Callable[..., HipTenant]
) -> None:
    """A first HIP call of class D (hipGetDeviceCount: the runtime initializes itself in it)
    registers the process and parks at a closed gate, as a CUDA process's cuInit does."""
    gate.close(HOLDER, 1)
    gate.drain(HOLDER, 1, 10.0)
    t = sibling()
    time.sleep(0.5)  # started, no HIP call yet
    assert mine(gate, t.pid) == []
    t.send("count")
    wait_for(lambda: mine(gate, t.pid) != [], what="the first HIP call registered")
    time.sleep(0.3)
    assert t.pending(), "the runtime initialized past the closed gate"
    reopened = time.monotonic_ns()
    gate.reopen(HOLDER, 1)
    r = t.reply()
    assert r["rc"] == 0 and r["count"] == 1 and r["t1"] >= reopened, r
    assert (
        Verifier(lambda tenant: [t.pid] if tenant == SIBLING else None).resolve(
            mine(gate, t.pid)[0]
        )
        == t.pid
    )


def test_a_first_class_d_call_outside_krex_passes_through(
    shim_build: ShimBuild, fh: FakeHip
) -> None:
    """Not under krex, nothing changes: the runtime starts in the program's own first call."""
    env = fh.env(LD_PRELOAD=str(shim_build.shim))
    t = HipTenant(env)
    try:
        assert t.run("count")["count"] == 1
    finally:
        t.close()


# ---- the gate and the drain ----------------------------------------------------------


LAUNCHES = {
    "launch": "hipModuleLaunchKernel",
    "launch_ptr": "hipLaunchKernel",
    "ext": "hipExtModuleLaunchKernel",
}


@pytest.mark.parametrize("cmd", sorted(LAUNCHES))
def test_a_hip_launch_parks_at_a_closed_gate(
    fh: FakeHip, gate: Gate, sibling: Callable[..., HipTenant], cmd: str
) -> None:
    """hipModuleLaunchKernel, hipLaunchKernel, hipExtModuleLaunchKernel wait for the reopen."""
    t = sibling()
    t.run("init")
    gate.close(HOLDER, 1)
    gate.drain(HOLDER, 1, 10.0)
    s = mine(gate, t.pid)[0]
    t.send(f"{cmd} 1000000")
    wait_for(lambda: mine(gate, t.pid)[0].blocked_calls > s.blocked_calls, what="the launch parked")
    time.sleep(0.3)
    assert t.pending(), f"{LAUNCHES[cmd]} passed the closed gate"
    reopened = time.monotonic_ns()
    gate.reopen(HOLDER, 1)
    r = t.reply()
    assert r["rc"] == 0, r
    ks = kernels_of(fh, t.pid)
    assert len(ks) == 1 and ks[0].start_ns >= reopened, ks


def test_hip_graph_launch_is_gated(
    fh: FakeHip, gate: Gate, sibling: Callable[..., HipTenant]
) -> None:
    """hipGraphLaunch parks at a closed gate; the capture before it ran nothing."""
    t = sibling()
    t.run("init")
    s = t.run("stream")["stream"]
    t.run(f"capture_begin {s}")
    t.run(f"launch 1000000 {s}")
    t.run(f"launch 1000000 {s}")
    t.run(f"capture_end {s}")
    assert kernels_of(fh, t.pid) == [], "captured launches do not run"
    gate.close(HOLDER, 1)
    gate.drain(HOLDER, 1, 10.0)
    t.send(f"graph_launch {s}")
    time.sleep(0.4)
    assert t.pending(), "hipGraphLaunch passed the closed gate"
    reopened = time.monotonic_ns()
    gate.reopen(HOLDER, 1)
    assert t.reply()["rc"] == 0
    t.run("sync")
    ks = kernels_of(fh, t.pid)
    assert len(ks) == 2 and all(k.kind == "G" and k.start_ns >= reopened for k in ks), ks


def test_the_drain_waits_for_hip_kernels_in_flight(
    fh: FakeHip, gate: Gate, sibling: Callable[..., HipTenant]
) -> None:
    """A kernel queued before the close ends before the grant: none runs inside the region."""
    t = sibling()
    t.run("init")
    s = t.run("stream")["stream"]
    t0 = time.monotonic_ns()
    t.run(f"launch {KERNEL_NS} {s}")
    t.run(f"launch_ptr {KERNEL_NS // 2}")  # the null stream, after the stream's (blocking)
    span = region(gate, 1)
    ks = kernels_of(fh, t.pid)
    assert len(ks) == 2, ks
    assert inside(ks, span) == [], "a HIP sibling kernel ran inside the region"
    assert span[0] - t0 >= KERNEL_NS, "the grant came before the kernels ended"


@pytest.mark.parametrize("link", ["direct", "dlsym"])
def test_hipbench_is_gated_linked_or_through_dlsym(
    shim_build: ShimBuild, fh: FakeHip, gate: Gate, link: str
) -> None:
    """hipbench launching all the time (linked, or dlopen + dlsym): no kernel in any region."""
    env = fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, SIBLING))
    proc = fh.hipbench_proc(
        "--link", link, "--mode", "module", "--seconds", "3", "--kernel-ns", "2000000",
        "--streams", "2", env=env,
    )  # fmt: skip
    try:
        wait_for(lambda: any(s.tenant == SIBLING for s in gate.registrations()), what="registered")
        time.sleep(0.3)
        spans = [region(gate, e, hold_s=0.2) for e in (1, 2, 3)]
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["symbols"]["hipModuleLaunchKernel"]["object"] == "libkrex_shim.so", summary
    ks = kernels_of(fh, summary["pid"])
    assert len(ks) > 20, "hipbench kept launching between the regions"
    for span in spans:
        assert inside(ks, span) == [], f"hipbench kernels inside a region ({link})"


# ---- the runtime's version --------------------------------------------------------------


def test_a_runtime_newer_than_the_table_is_refused(
    shim_build: ShimBuild, fh: FakeHip, gate: Gate
) -> None:
    """HIP 7 (no compatible major): one line, every gated call fails, nothing runs.  The process
    registered: the version query (which starts a real runtime) is made inside the gate."""
    env = fh.env(
        LD_PRELOAD=str(shim_build.shim), KREX_FAKE_HIP_VERSION="70100000", **tenant_env(gate, 2)
    )
    proc = subprocess.run(
        [str(fh.hip.hipbench), "--count", "3"], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 1, proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert (err["call"], err["code"]) == ("hipInit", 801), err  # hipErrorNotSupported
    lines = [ln for ln in proc.stderr.splitlines() if "HIP runtime 7.1" in ln]
    assert len(lines) == 1, proc.stderr
    assert "newer than the shim's HIP table" in lines[0]
    assert [s.gated_calls for s in gate.registrations() if s.state != "free"] == [1]  # the load's
    assert fh.records() == []


def test_a_compatible_newer_runtime_and_pass_through_are_not_refused(
    shim_build: ShimBuild, fh: FakeHip, gate: Gate
) -> None:
    """HIP 6.2 (the fake's own version: a compatible major whose exports the table knows)
    is gated; HIP 7 outside krex passes through."""
    env = fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, SIBLING))
    out = fh.hipbench("--count", "2", env=env)
    assert out["launches"] == 2
    assert any(s.tenant == SIBLING for s in gate.registrations())
    plain = fh.env(LD_PRELOAD=str(shim_build.shim), KREX_FAKE_HIP_VERSION="70100000")
    assert fh.hipbench("--count", "2", env=plain)["launches"] == 2


# ---- CUDA and HIP in one process ---------------------------------------------------------


@pytest.mark.parametrize("longer", ["hip", "cuda"])
def test_a_process_using_cuda_and_hip_drains_both(
    fh: FakeHip, gate: Gate, sibling: Callable[..., HipTenant], longer: str
) -> None:
    """One registration; the drain waits for the longer kernel, whichever runtime ran it."""
    t = sibling()
    t.run("init")
    t.run("cuda_init")
    cuda_ns, hip_ns = (
        (KERNEL_NS // 4, KERNEL_NS) if longer == "hip" else (KERNEL_NS, KERNEL_NS // 4)
    )
    t0 = time.monotonic_ns()
    t.run(f"cuda_launch {cuda_ns}")
    t.run(f"launch {hip_ns}")
    assert len(mine(gate, t.pid)) == 1, "one registration for both runtimes"
    span = region(gate, 1)
    ks = kernels_of(fh, t.pid)
    assert len(ks) == 2, ks
    assert inside(ks, span) == [], "a kernel of the mixed process ran inside the region"
    assert span[0] - t0 >= KERNEL_NS, f"the grant came before the {longer} kernel ended"


# ---- adversarial -------------------------------------------------------------------------


def test_a_capture_begun_on_a_busy_stream(
    fh: FakeHip, gate: Gate, sibling: Callable[..., HipTenant]
) -> None:
    """A kernel queued, then a capture begun on its stream (no synchronize between): the drain
    waits for the kernel without touching the capture, which stays valid and usable."""
    t = sibling()
    t.run("init")
    s = t.run("stream")["stream"]
    t0 = time.monotonic_ns()
    t.run(f"launch {KERNEL_NS} {s}")
    t.run(f"capture_begin {s}")
    span = region(gate, 1)
    assert span[0] - t0 >= KERNEL_NS, "the grant came before the pre-capture kernel ended"
    assert t.run(f"capture_status {s}")["status"] == "active", "the drain invalidated the capture"
    t.run(f"launch 1000000 {s}")
    t.run(f"capture_end {s}")
    t.run(f"graph_launch {s}")
    t.run("sync")
    ks = kernels_of(fh, t.pid)
    assert [k.kind for k in ks].count("G") == 1, ks
    assert inside(ks, span) == []


def test_captured_launches_pass_a_closed_gate_uncounted(
    fh: FakeHip, gate: Gate, sibling: Callable[..., HipTenant]
) -> None:
    """While a sibling holds the gate, a launch into a capturing stream records, it does not
    park; the capture ends, and the graph's instantiation (class C: it may create streams,
    hardware queues) parks."""
    t = sibling()
    t.run("init")
    s = t.run("stream")["stream"]
    t.run(f"capture_begin {s}")
    gate.close(HOLDER, 1)
    gate.drain(HOLDER, 1, 10.0)
    t.run(f"launch 1000000 {s}", timeout=5)  # would time out if it parked
    t.send(f"capture_end {s}")  # hipStreamEndCapture, then hipGraphInstantiate
    time.sleep(0.3)
    assert t.pending(), "hipGraphInstantiate passed the closed gate"
    gate.reopen(HOLDER, 1)
    assert t.reply()["rc"] == 0
    t.run(f"graph_launch {s}")
    t.run("sync")
    assert [k.kind for k in kernels_of(fh, t.pid)] == ["G"]


def test_a_forked_hip_tenant(fh: FakeHip, gate: Gate, sibling: Callable[..., HipTenant]) -> None:
    """The parent's kernel is drained; the child registers on its own and its call parks at
    the closed gate (over the fake runtime a child of an initialized process cannot use the
    GPU: its call then fails, as a real runtime's would)."""
    t = sibling()
    t.run("init")
    t0 = time.monotonic_ns()
    t.run(f"launch {KERNEL_NS}")
    t.send("fork")
    child = t.reply()["child"]
    result: dict[str, tuple[int, int]] = {}
    closed = threading.Event()

    def hold() -> None:
        gate.close(HOLDER, 1)
        closed.set()
        result["span"] = region_after_close(gate, 1)

    th = threading.Thread(target=hold)
    th.start()
    closed.wait(5)
    t.send("launch 1000000")  # the child's
    th.join(20)
    assert not th.is_alive()
    span = result["span"]
    assert span[0] - t0 >= KERNEL_NS, "the grant came before the parent's kernel ended"
    r = t.reply()
    assert r["pid"] == child and r["t1"] >= span[1], "the child's call passed the closed gate"
    assert [s for s in gate.registrations() if s.pid == child and s.state != "free"], (
        "the child registered"
    )
    t.send("quit")  # the child
    assert t.reply()["child_rc"] == 0
    assert inside(kernels_of(fh, t.pid), span) == []


def region_after_close(gate: Gate, epoch: int) -> tuple[int, int]:
    gate.drain(HOLDER, epoch, 15.0)
    start = time.monotonic_ns()
    time.sleep(0.4)
    end = time.monotonic_ns()
    gate.reopen(HOLDER, epoch)
    return start, end


def test_a_cuda_process_never_loads_the_hip_runtime(
    shim_build: ShimBuild, fh: FakeHip, gate: Gate
) -> None:
    """The HIP hooks cost a CUDA process nothing: it never maps libamdhip64."""
    code = (
        "import fakegpu, os; g = fakegpu.init(); g.launch(1000); g.synchronize(); "
        "print(any('libamdhip64' in l for l in open('/proc/self/maps')))"
    )
    env = fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, SIBLING))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---- device memory ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sync", "async", "memcreate", "malloc3d", "array"])
def test_hip_device_memory_is_counted_in_the_slot(
    gate: Gate, sibling: Callable[..., HipTenant], how: str
) -> None:
    """hipMalloc/hipFree (hipMallocAsync/hipFreeAsync, hipMemCreate/hipMemRelease,
    hipMalloc3D/hipFree, hipMalloc3DArray/hipFreeArray) move the slot's mem_mib, the figure
    krexd reads where amdsmi gives none; a failed free changes nothing."""
    extra = [] if how == "sync" else [how]
    t = sibling()
    a = t.run(" ".join(["malloc", "300", *extra]))["ptr"]
    b = t.run(" ".join(["malloc", "100", *extra]))["ptr"]
    assert mine(gate, t.pid)[0].mem_mib == 400
    t.run(" ".join(["free", str(a), *extra]))
    assert mine(gate, t.pid)[0].mem_mib == 100
    t.send(" ".join(["free", str(a), *extra]))  # again: the runtime refuses it
    assert t.reply()["rc"] != 0
    assert mine(gate, t.pid)[0].mem_mib == 100
    t.run(" ".join(["free", str(b), *extra]))
    assert mine(gate, t.pid)[0].mem_mib == 0


# ---- the GPU binding -----------------------------------------------------------------------

WRONG_GPU = 83  # krex_client.errors.ExitCode.WRONG_GPU


@pytest.mark.parametrize(
    ("visible", "ok"),
    [
        ({"ROCR_VISIBLE_DEVICES": fake_amd_uuid(1), "HIP_VISIBLE_DEVICES": "0"}, True),  # krexd's
        ({"ROCR_VISIBLE_DEVICES": fake_amd_uuid(0), "HIP_VISIBLE_DEVICES": "0"}, False),
        ({"HIP_VISIBLE_DEVICES": "1,0"}, False),  # its own GPU first, another one visible
        ({}, False),  # the variables unset: every GPU
    ],
    ids=["bound", "other", "widened", "unset"],
)
def test_a_hip_command_sees_only_its_own_gpu(
    shim_build: ShimBuild, fh: FakeHip, gate: Gate, visible: dict[str, str], ok: bool
) -> None:
    """Bound to simulated AMD GPU 1 (KREX_GPU_UUID, ROCr's form): any other visible device ends
    the command at its first HIP call (exit 83, one line), before any kernel."""
    env = fh.env(
        LD_PRELOAD=str(shim_build.shim), KREX_FAKE_GPUS="2", KREX_GPU_UUID=fake_amd_uuid(1),
        **tenant_env(gate, SIBLING), **visible,
    )  # fmt: skip
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [str(fh.hip.hipbench), "--count", "2"], env=env, capture_output=True, text=True, timeout=30
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["launches"] == 2
        return
    assert proc.returncode == WRONG_GPU, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("krex: refusing HIP work")]
    assert len(lines) == 1 and f"bound to {fake_amd_uuid(1)}" in lines[0], proc.stderr
    assert fh.records() == []


# ---- the fault record ----------------------------------------------------------------------


def test_a_hip_process_records_its_fatal_error(
    shim_build: ShimBuild, fh: FakeHip, gate: Gate
) -> None:
    """A kernel faults (hipErrorIllegalAddress, sticky): the next gated call returns it and the
    shim records it in the slot, with "had launched", as for CUDA (tests/shim/test_fault_record.py);
    a healthy HIP process records nothing."""
    ok = fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2))
    bad = fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 3))
    assert fh.hipbench("--count", "3", env=ok)["launches"] == 3
    proc = fh.hipbench_proc("--count", "50", "--fault-after", "4", env=bad)
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    faults = {s.tenant: s.fault for s in gate.registrations() if s.tenant}
    assert faults[2] is None, "a healthy process recorded a fault"
    assert faults[3] == FaultSeen(code=700, launched=True, at_sync=False)
