"""Is the CUDA driver's checkpoint lock a drain krexd can rely on?  (issue 28, item 1)

Measures, as root on a GPU host, what ``cuCheckpointProcessLock`` does to another
process (benchmarks/checkpoint_victim.py, driven over stdin):
  idle       lock and unlock latency of an idle PyTorch process
  queued     with ~1 s of matmuls queued: does the lock return only after they
             finished (host time vs the victim's own events), and does a GEMM
             timed in another process right after the lock run at its alone speed
  timeout    a lock with a 200 ms timeout over 2 s of queued work: result, state
  blocked    a process launching every 0.5 ms is held while locked
  parallel   1, 7 and 15 processes locked (and unlocked) at once, idle and queued
  cupy/triton  other frameworks' processes
  nocuda     a process without CUDA, a PyTorch process before CUDA init
  frozen     lock a process in a frozen cgroup; lock, then freeze
  mps        a process that is an MPS client
  nvml       per-process utilization samples for bursts of 2-200 ms
  killed     a process killed while locked; unlock afterwards
Usage: python3 benchmarks/checkpoint_lock.py OUT.json [section ...]
The driver calls go through ctypes on libcuda.so.1 (the GIL is released), as
krexd would make them; this process never creates a context.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
VICTIM = os.path.join(HERE, "checkpoint_victim.py")


class LockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class UnlockArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
sys.setrecursionlimit(10000)


def errname(rc: int) -> str:
    s = ctypes.c_char_p()
    cu.cuGetErrorName(rc, ctypes.byref(s))
    return (s.value or b"?").decode()


def lock(pid: int, timeout_ms: int = 5000) -> tuple[str, float]:
    a = LockArgs(timeout_ms)
    t = time.monotonic()
    rc = cu.cuCheckpointProcessLock(pid, ctypes.byref(a))
    return errname(rc), (time.monotonic() - t) * 1e3


def unlock(pid: int) -> tuple[str, float]:
    a = UnlockArgs()
    t = time.monotonic()
    rc = cu.cuCheckpointProcessUnlock(pid, ctypes.byref(a))
    return errname(rc), (time.monotonic() - t) * 1e3


def state(pid: int) -> str:
    st = ctypes.c_int(-1)
    rc = cu.cuCheckpointProcessGetState(pid, ctypes.byref(st))
    names = {0: "RUNNING", 1: "LOCKED", 2: "CHECKPOINTED", 3: "FAILED"}
    return names.get(st.value, str(st.value)) if rc == 0 else errname(rc)


class Victim:
    def __init__(self, fw: str = "torch", env: dict | None = None, cgroup: str | None = None):
        pre = None
        if cgroup:

            def pre() -> None:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write("0")

        self.p = subprocess.Popen(
            [sys.executable, VICTIM, fw],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=pre,
        )
        self.pid = self.p.pid

    def read(self, timeout: float = 120.0) -> dict[str, Any]:
        assert self.p.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"victim {self.pid} silent for {timeout}s")
        line = self.p.stdout.readline()
        if not line:
            raise EOFError(f"victim {self.pid} exited")
        return json.loads(line)

    def send(self, cmd: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def ask(self, cmd: str, timeout: float = 120.0) -> dict[str, Any]:
        self.send(cmd)
        return self.read(timeout)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def spawn(n: int, **kw: Any) -> tuple[list[Victim], list[float]]:
    vs = [Victim(**kw) for _ in range(n)]
    mm = [v.read(180)["mm_ms"] for v in vs]
    return vs, mm


def pct(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "p50": round(statistics.median(xs), 3),
        "max": round(xs[-1], 3),
        "min": round(xs[0], 3),
        "n": len(xs),
    }


def s_idle(r: dict) -> None:
    (v,), _ = spawn(1)
    lk, ul, states = [], [], []
    for _ in range(20):
        rc, ms = lock(v.pid)
        states.append(f"{rc}/{state(v.pid)}")
        lk.append(ms)
        rc2, ms2 = unlock(v.pid)
        ul.append(ms2)
        states.append(f"{rc2}/{state(v.pid)}")
    r["idle"] = {"lock_ms": pct(lk), "unlock_ms": pct(ul), "states": sorted(set(states))}
    r["idle"]["after_ok"] = v.ask("bench 3")["mm_ms"]
    v.close()


def s_queued(r: dict) -> None:
    (v, m), mm = spawn(2)
    alone = m.ask("bench 20")["mm_ms"]
    runs = []
    for _ in range(3):
        q = v.ask("queue 1000")
        rc, ms = lock(v.pid, 10000)
        t_lock = time.monotonic()
        b = m.ask("bench 20")
        urc, ums = unlock(v.pid)
        e = v.ask("elapsed")["ms"]
        done = q["t_begin"] + e / 1e3
        runs.append(
            {
                "lock": rc,
                "lock_ms": round(ms, 2),
                "enqueue_ms": round((q["t_queued"] - q["t_begin"]) * 1e3, 2),
                "queued_gpu_ms": round(e, 1),
                "lock_returned_minus_work_done_ms": round((t_lock - done) * 1e3, 2),
                "gemm_after_lock_vs_alone": round(b["mm_ms"] / alone, 3),
                "unlock": urc,
                "unlock_ms": round(ums, 2),
            }
        )
    # the victim inside cuCtxSynchronize when locked
    q = v.ask("queue 1000")
    v.send("sync")
    time.sleep(0.1)
    rc, ms = lock(v.pid, 10000)
    t_lock = time.monotonic()
    urc, _ = unlock(v.pid)
    s = v.read()
    e = v.ask("elapsed")["ms"]
    r["queued"] = {
        "victim_mm_ms": mm[0],
        "alone_mm_ms": alone,
        "runs": runs,
        "in_sync": {
            "lock": rc,
            "lock_ms": round(ms, 2),
            "lock_returned_minus_work_done_ms": round((t_lock - q["t_begin"] - e / 1e3) * 1e3, 2),
            "sync_returned_minus_lock_ms": round((s["t_synced"] - t_lock) * 1e3, 2),
        },
    }
    # timeout: 2 s queued, lock with 200 ms
    v.ask("queue 2000")
    rc, ms = lock(v.pid, 200)
    st = state(v.pid)
    if rc == "CUDA_SUCCESS":
        unlock(v.pid)
    v.ask("sync")
    r["timeout"] = {"lock": rc, "lock_ms": round(ms, 2), "state_after": st}
    v.close()
    m.close()


def s_blocked(r: dict) -> None:
    (v,), _ = spawn(1)
    v.send("tick 2")
    time.sleep(0.5)
    rc, ms = lock(v.pid)
    t0 = time.monotonic()
    time.sleep(0.3)
    urc, _ = unlock(v.pid)
    held = (time.monotonic() - t0) * 1e3
    a = v.read()
    r["blocked"] = {
        "lock": rc,
        "held_ms": round(held, 1),
        "victim_max_gap_ms": round(a["max_gap_ms"], 1),
        "gap_began_minus_lock_ms": round((a["gap_began"] - t0) * 1e3, 1),
    }
    v.close()


def _par(fn: Any, pids: list[int]) -> tuple[float, list[Any]]:
    with ThreadPoolExecutor(len(pids)) as ex:
        t = time.monotonic()
        res = list(ex.map(fn, pids))
        return (time.monotonic() - t) * 1e3, res


def s_parallel(r: dict) -> None:
    vs, _ = spawn(15)
    out: dict[str, Any] = {}
    for n in (1, 7, 15):
        pids = [v.pid for v in vs[:n]]
        lw, uw, worst, bad = [], [], [], set()
        for _ in range(5):
            w, res = _par(lock, pids)
            lw.append(w)
            worst.append(max(x[1] for x in res))
            bad |= {x[0] for x in res}
            w2, res2 = _par(unlock, pids)
            uw.append(w2)
            bad |= {x[0] for x in res2}
        # every process with ~100 ms queued
        for v in vs[:n]:
            v.ask("queue 100")
        w, res = _par(lambda p: lock(p, 10000), pids)
        _par(unlock, pids)
        for v in vs[:n]:
            v.ask("sync")
        out[str(n)] = {
            "lock_wall_ms": pct(lw),
            "slowest_lock_ms": pct(worst),
            "unlock_wall_ms": pct(uw),
            "results": sorted(bad),
            "queued_100ms_each_lock_wall_ms": round(w, 1),
        }
    r["parallel"] = out
    for v in vs:
        v.close()


def s_frameworks(r: dict) -> None:
    out: dict[str, Any] = {}
    (c,), _ = spawn(1, fw="cupy")
    lk = [lock(c.pid)[1] for _ in range(1) if True]
    unlock(c.pid)
    q = c.ask("queue 500")
    rc, ms = lock(c.pid, 10000)
    t = time.monotonic()
    unlock(c.pid)
    e = c.ask("elapsed")["ms"]
    out["cupy"] = {
        "idle_lock_ms": round(lk[0], 2),
        "queued_lock": rc,
        "queued_lock_ms": round(ms, 1),
        "lock_returned_minus_work_done_ms": round((t - q["t_begin"] - e / 1e3) * 1e3, 2),
    }
    c.close()
    (v,), _ = spawn(1)
    v.ask("triton")
    rc, ms = lock(v.pid)
    urc, _ = unlock(v.pid)
    out["triton"] = {"lock": rc, "lock_ms": round(ms, 2), "after": v.ask("triton")}
    v.close()
    r["frameworks"] = out


def s_nocuda(r: dict) -> None:
    p = subprocess.Popen(["sleep", "30"])
    q = subprocess.Popen([sys.executable, "-c", "import torch, time; time.sleep(30)"])
    time.sleep(6)
    r["nocuda"] = {
        "sleep": lock(p.pid, 1000),
        "torch_no_init": lock(q.pid, 1000),
        "no_such_pid": lock(4_000_000, 1000),
    }
    for x in (p, q):
        x.kill()
        x.wait()


def _freeze(cg: str, on: bool, limit_s: float = 5.0) -> float:
    """Freeze (or thaw) ``cg`` and wait until the kernel says so: ms, or -1 after ``limit_s``."""
    t = time.monotonic()
    with open(os.path.join(cg, "cgroup.freeze"), "w") as f:
        f.write("1" if on else "0")
    want = "frozen 1" if on else "frozen 0"
    while time.monotonic() - t < limit_s:
        with open(os.path.join(cg, "cgroup.events")) as f:
            if want in f.read():
                return (time.monotonic() - t) * 1e3
        time.sleep(0.0002)
    return -1.0


def s_frozen(r: dict) -> None:
    cg = "/sys/fs/cgroup/krex-cklock"
    os.makedirs(cg, exist_ok=True)
    out: dict[str, Any] = {}
    try:
        (v,), _ = spawn(1, cgroup=cg)
        v.ask("queue 300")
        _freeze(cg, True)
        rc, ms = lock(v.pid, 3000)
        out["lock_when_frozen"] = {"lock": rc, "lock_ms": round(ms, 1), "state": state(v.pid)}
        _freeze(cg, False)
        if rc == "CUDA_SUCCESS":
            out["lock_when_frozen"]["unlock"] = unlock(v.pid)
        v.ask("sync", 30)
        v.ask("queue 300")
        rc, ms = lock(v.pid, 5000)
        fz = _freeze(cg, True)
        time.sleep(0.1)
        th = _freeze(cg, False)
        urc, ums = unlock(v.pid)
        ok = v.ask("bench 3", 30)
        # lock, freeze, unlock while frozen, thaw
        v.ask("queue 300")
        rc2, ms2 = lock(v.pid, 5000)
        _freeze(cg, True)
        urc2, ums2 = unlock(v.pid)
        st2 = state(v.pid)
        _freeze(cg, False)
        ok2 = v.ask("bench 3", 30)
        out["unlock_while_frozen"] = {
            "lock": rc2,
            "lock_ms": round(ms2, 1),
            "unlock": urc2,
            "unlock_ms": round(ums2, 2),
            "state": st2,
            "victim_after_ok_mm_ms": ok2["mm_ms"],
        }
        out["lock_then_freeze"] = {
            "lock": rc,
            "lock_ms": round(ms, 1),
            "freeze_ms": round(fz, 2),
            "thaw_ms": round(th, 2),
            "unlock": urc,
            "victim_after_ok_mm_ms": ok["mm_ms"],
        }
        v.close()
    finally:
        r["frozen"] = out
        try:
            _freeze(cg, False)
            os.rmdir(cg)
        except OSError:
            pass


def s_mps(r: dict) -> None:
    d = tempfile.mkdtemp()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=d + "/p", CUDA_MPS_LOG_DIRECTORY=d + "/l")
    os.makedirs(d + "/p")
    os.makedirs(d + "/l")
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    out: dict[str, Any] = {}
    try:
        (v, m), _ = spawn(2, env=env)
        alone = m.ask("bench 20")["mm_ms"]
        lk = []
        for _ in range(5):
            rc, ms = lock(v.pid)
            lk.append(ms)
            unlock(v.pid)
        q = v.ask("queue 1000")
        rc, ms = lock(v.pid, 10000)
        t = time.monotonic()
        b = m.ask("bench 20")
        unlock(v.pid)
        e = v.ask("elapsed")["ms"]
        out = {
            "idle_lock": rc,
            "idle_lock_ms": pct(lk),
            "queued_lock_ms": round(ms, 1),
            "lock_returned_minus_work_done_ms": round((t - q["t_begin"] - e / 1e3) * 1e3, 2),
            "gemm_after_lock_vs_alone": round(b["mm_ms"] / alone, 3),
        }
        v.close()
        m.close()
    except Exception as exc:  # noqa: BLE001 - record what MPS did
        out["error"] = repr(exc)
    finally:
        r["mps"] = out
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env)


def s_nvml(r: dict) -> None:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    (v,), _ = spawn(1)
    t = time.monotonic()
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    list_ms = (time.monotonic() - t) * 1e3
    out: dict[str, Any] = {
        "compute_procs": [p.pid for p in procs],
        "victim": v.pid,
        "list_ms": round(list_ms, 3),
    }
    for burst in (0, 2, 10, 50, 200):
        time.sleep(1.0)
        ts = int(time.time() * 1e6)
        if burst:
            v.ask(f"queue {burst}")
            v.ask("sync")
        time.sleep(1.5)
        t = time.monotonic()
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, ts)
        except pynvml.NVMLError as exc:
            out[f"burst_{burst}"] = repr(exc)
            continue
        q_ms = (time.monotonic() - t) * 1e3
        mine = [s for s in samples if s.pid == v.pid]
        out[f"burst_{burst}"] = {
            "samples": len(samples),
            "victim_samples": len(mine),
            "victim_sm": [s.smUtil for s in mine],
            "victim_ts_rel_ms": [round((s.timeStamp - ts) / 1e3, 1) for s in mine],
            "query_ms": round(q_ms, 2),
        }
    v.close()
    r["nvml"] = out


def s_killed(r: dict) -> None:
    (v,), _ = spawn(1)
    rc, _ = lock(v.pid)
    v.p.kill()
    t = time.monotonic()
    try:
        v.p.wait(20)
        exit_ms: float | str = round((time.monotonic() - t) * 1e3, 1)
    except subprocess.TimeoutExpired:
        exit_ms = "did not exit in 20 s"
    out = {"lock": rc, "exit_ms": exit_ms, "unlock_after": unlock(v.pid), "state": state(v.pid)}
    (w,), _ = spawn(1)
    out["fresh_process_lock"] = lock(w.pid)
    unlock(w.pid)
    w.close()
    r["killed"] = out


def s_killed_queued(r: dict) -> None:
    """A process killed with ~2 s of work queued: does its work stop when it leaves?"""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    (v, m), _ = spawn(2)
    alone = m.ask("bench 20")["mm_ms"]
    q = v.ask("queue 2000")
    t_kill = time.monotonic()
    v.p.kill()
    v.p.wait()
    t_exit = time.monotonic()
    while v.pid in {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}:
        time.sleep(0.001)
    t_gone = time.monotonic()
    b = m.ask("bench 20")
    r["killed_queued"] = {
        "queued_ms": round((q["t_queued"] - q["t_begin"]) * 1e3, 1),
        "exit_ms": round((t_exit - t_kill) * 1e3, 1),
        "left_nvml_ms": round((t_gone - t_kill) * 1e3, 1),
        "gemm_after_left_vs_alone": round(b["mm_ms"] / alone, 3),
        "work_would_have_ended_ms_after_kill": round((q["t_begin"] + 2.0 - t_kill) * 1e3, 1),
    }
    m.close()


def _in_child(op: str, pid: int, timeout_ms: int, limit_s: float) -> dict[str, Any]:
    """``op`` (lock/unlock) of ``pid`` from a child process, killed after ``limit_s``."""
    extra = f", {timeout_ms}" if op == "lock" else ""
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import checkpoint_lock as c, json; "
        f"print(json.dumps(c.{op}({pid:d}{extra})))"
    )
    t = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=limit_s
        )
        return {"result": out.stdout.strip(), "ms": round((time.monotonic() - t) * 1e3, 1)}
    except subprocess.TimeoutExpired:
        return {"result": f"no return in {limit_s} s (child killed)", "ms": limit_s * 1e3}


def s_frozen_safe(r: dict) -> None:
    """Frozen cgroups, each driver call from a child that is killed if it hangs."""
    cg = "/sys/fs/cgroup/krex-cklock3"
    os.makedirs(cg, exist_ok=True)
    out: dict[str, Any] = {}
    try:
        (v,), _ = spawn(1, cgroup=cg)
        # lock, freeze, unlock while frozen, thaw
        v.ask("queue 300")
        out["lock_running"] = _in_child("lock", v.pid, 5000, 8)
        print("locked", out, flush=True)
        out["freeze_locked_ms"] = _freeze(cg, True)
        print("froze", out, flush=True)
        out["unlock_while_frozen"] = _in_child("unlock", v.pid, 0, 8)
        print("unlocked", out, flush=True)
        out["state_frozen"] = state(v.pid)
        out["thaw_locked_ms"] = _freeze(cg, False)
        try:
            out["victim_after"] = v.ask("bench 3", 20)
        except Exception as exc:  # noqa: BLE001
            out["victim_after"] = repr(exc)
        # lock while frozen (idle victim), with a 2 s timeout
        out["freeze_idle_ms"] = _freeze(cg, True)
        out["lock_idle_frozen"] = _in_child("lock", v.pid, 2000, 8)
        print("lock frozen", out, flush=True)
        out["thaw_ms"] = _freeze(cg, False)
        out["state_after_thaw"] = state(v.pid)
        if out["state_after_thaw"] == "LOCKED":
            out["unlock_after_thaw"] = unlock(v.pid)
        try:
            out["victim_after2"] = v.ask("bench 3", 20)
        except Exception as exc:  # noqa: BLE001
            out["victim_after2"] = repr(exc)
        v.close()
    finally:
        r["frozen_safe"] = out
        try:
            _freeze(cg, False)
        except OSError:
            pass


SECTIONS = {
    "idle": s_idle,
    "queued": s_queued,
    "blocked": s_blocked,
    "parallel": s_parallel,
    "frameworks": s_frameworks,
    "nocuda": s_nocuda,
    "frozen": s_frozen,
    "mps": s_mps,
    "nvml": s_nvml,
    "killed": s_killed,
    "killed_queued": s_killed_queued,
    "frozen_safe": s_frozen_safe,
}


def main() -> None:
    out_path = sys.argv[1]
    names = sys.argv[2:] or list(SECTIONS)
    signal.alarm(560)
    r: dict[str, Any] = {}
    for name in names:
        t = time.monotonic()
        try:
            SECTIONS[name](r)
        except Exception as exc:  # noqa: BLE001 - a failed section is a result
            r.setdefault(name, {})
            r[f"{name}_error"] = repr(exc)
        print(f"== {name} ({time.monotonic() - t:.1f} s)", flush=True)
        print(json.dumps(r.get(name), indent=None)[:3000], flush=True)
        with open(out_path, "w") as f:
            json.dump(r, f, indent=1)
        if f"{name}_error" in r:
            print("   ERROR", r[f"{name}_error"], flush=True)


if __name__ == "__main__":
    main()
