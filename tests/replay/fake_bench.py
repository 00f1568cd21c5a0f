"""A benchmarking command for replay tests: no framework, simulated kernels.

Times ``--reps`` kernels of ``--kernel-us`` µs inside ``region.critical()``
and prints the same JSON result line as workloads/harness.py.  A kernel is
a launch on the fake driver (tests/fakecuda/fakegpu.py) when that driver is
built, else a sleep of the same length.  ``--fail`` exits 3 without a result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

T_START = time.time()


def kernel_fn(us: float) -> Callable[[], None]:
    """A callable that runs one kernel of ``us`` µs to completion."""
    fake_dir = Path(__file__).resolve().parents[1] / "fakecuda"
    if (fake_dir / "fakegpu.py").is_file() and os.environ.get("FAKE_BENCH_SLEEP") != "1":
        sys.path.insert(0, str(fake_dir))
        try:
            import fakegpu  # type: ignore[import-not-found, unused-ignore]

            fakegpu.init()

            def run_fake() -> None:
                fakegpu.launch(int(us * 1000))
                fakegpu.synchronize()

            return run_fake
        except Exception:  # the fake driver is not built: fall back to sleeping
            pass

    def run_sleep() -> None:
        time.sleep(us / 1e6)

    return run_sleep


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--task", required=True)
    p.add_argument("--candidate", required=True)
    p.add_argument("--kernel-us", type=float, required=True)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--fail", action="store_true")
    p.add_argument(
        "--setup-ms",
        type=float,
        default=0.0,
        help="time spent before the region, as imports, compilation and correctness "
        "checks would (half asleep, half launching kernels)",
    )
    a = p.parse_args()
    if a.fail:
        print("failing on purpose", file=sys.stderr)
        return 3
    from krex_client import region

    t_imports = time.time()
    fn = kernel_fn(a.kernel_us)
    fn()
    setup_end = time.time() + a.setup_ms / 1e3
    while time.time() < setup_end:  # off-region work: sleeps and kernels
        time.sleep(0.005)
        fn()
    t_ready = time.time()
    times: list[float] = []
    with region.critical():
        t_in = time.time()
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000.0)
        t_out = time.time()
    st = region.stats()
    admit = os.environ.get("KREX_ADMIT_MS")
    phases = {
        "imports_ms": (t_imports - T_START) * 1000.0,
        "context_ms": 0.0,
        "build_ms": (t_ready - t_imports) * 1000.0,
        "correctness_ms": 0.0,
        "region_wait_ms": float(st.get("entry_ms", 0.0)),
        "in_region_ms": (t_out - t_in) * 1000.0,
    }
    if admit is not None:
        phases["admit_ms"] = float(admit)
    line = {
        "task": a.task,
        "candidate": a.candidate,
        "median_ms": statistics.median(times),
        "mean_ms": statistics.fmean(times),
        "reps": len(times),
        "correct": True,
        "phases": phases,
        "t_print": time.time(),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
