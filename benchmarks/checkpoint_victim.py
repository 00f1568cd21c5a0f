"""A CUDA process driven over stdin, for benchmarks/checkpoint_lock.py.

One command a line on stdin, one JSON answer a line on stdout:
  queue MS   enqueue about MS ms of bf16 8192^3 matmuls (no synchronize),
             bracketed by two CUDA events; answers the host time before/after
  sync       synchronize; answers the host time it returned
  elapsed    synchronize, then the events' elapsed ms of the last queue
  bench N    N timed matmuls alone (synchronized): ms per matmul
  tick S     launch a tiny kernel every 0.5 ms for S seconds; answers the
             longest gap between launches (ms) and when it began
  triton     run one Triton kernel (loads a module through the driver)
  exit
Framework (argv[1]): torch (default) or cupy.  Times are CLOCK_MONOTONIC s.
"""

from __future__ import annotations

import json
import sys
import time


def _torch_ops():  # type: ignore[no-untyped-def]
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    small = torch.zeros(16, device="cuda")

    def mm() -> None:
        torch.mm(a, a)

    def event():  # type: ignore[no-untyped-def]
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    return mm, lambda: small.add_(1), torch.cuda.synchronize, event, lambda s, e: s.elapsed_time(e)


def _cupy_ops():  # type: ignore[no-untyped-def]
    import cupy as cp

    a = cp.random.rand(8192, 8192, dtype=cp.float32)
    small = cp.zeros(16, dtype=cp.float32)

    def mm() -> None:
        cp.matmul(a, a)

    def tiny() -> None:
        small.__iadd__(1)

    def event():  # type: ignore[no-untyped-def]
        e = cp.cuda.Event()
        e.record()
        return e

    return (
        mm,
        tiny,
        cp.cuda.Device().synchronize,
        event,
        lambda s, e: cp.cuda.get_elapsed_time(s, e),
    )


def _triton_once() -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _inc(x_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(1024, device="cuda")
    _inc[(4,)](x, 1024, BLOCK=256)
    torch.cuda.synchronize()


def main() -> None:
    fw = sys.argv[1] if len(sys.argv) > 1 else "torch"
    mm, tiny, sync, event, elapsed = _torch_ops() if fw == "torch" else _cupy_ops()
    for _ in range(3):
        mm()
    sync()
    t = time.perf_counter()
    for _ in range(10):
        mm()
    sync()
    per_mm = (time.perf_counter() - t) / 10 * 1e3
    out = sys.stdout
    out.write(json.dumps({"ready": True, "mm_ms": per_mm}) + "\n")
    out.flush()
    last: list = []
    for line in sys.stdin:
        cmd, *arg = line.split()
        ans: dict = {}
        if cmd == "queue":
            n = max(1, int(float(arg[0]) / per_mm))
            ans["t_begin"] = time.monotonic()
            s = event()
            for _ in range(n):
                mm()
            e = event()
            last = [s, e]
            ans["t_queued"] = time.monotonic()
            ans["n"] = n
        elif cmd == "sync":
            sync()
            ans["t_synced"] = time.monotonic()
        elif cmd == "elapsed":
            sync()
            ans["ms"] = elapsed(*last)
        elif cmd == "bench":
            sync()
            n = int(arg[0])
            t0 = time.monotonic()
            for _ in range(n):
                mm()
            sync()
            ans["t_begin"] = t0
            ans["mm_ms"] = (time.monotonic() - t0) / n * 1e3
        elif cmd == "tick":
            end = time.monotonic() + float(arg[0])
            prev = time.monotonic()
            gap, at = 0.0, prev
            while prev < end:
                tiny()
                now = time.monotonic()
                if now - prev > gap:
                    gap, at = now - prev, prev
                prev = now
                time.sleep(0.0005)
            ans["max_gap_ms"] = gap * 1e3
            ans["gap_began"] = at
        elif cmd == "triton":
            _triton_once()
            ans["ok"] = True
        elif cmd == "exit":
            break
        out.write(json.dumps(ans) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
