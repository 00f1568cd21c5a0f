"""A simulated benchmarking command: no framework, kernels of a chosen length.

The command ``make demo`` replays on a host without a GPU (krex_cli/demo.py),
a stand-in for the corpus of workloads/ where no GPU is at hand.  It sets up for
``--setup-ms`` (half asleep, half launching kernels, as imports, compilation
and correctness checks would), times ``--reps`` kernels of ``--kernel-us`` µs
inside ``region.critical()`` and prints the same JSON result line as
workloads/harness.py:

    python workloads/simulated.py --task T --candidate C --kernel-us 40 [--reps 20]
                                  [--setup-ms 1500] [--fail]

A kernel is a launch on the CUDA driver that ``libcuda.so.1`` names: the fake
driver that ``make`` builds (``LD_LIBRARY_PATH=build/fakecuda``) runs every
function as a *duration kernel* whose first parameter is its length in ns
(``uint64_t``), so under krex the shim gates these launches as it gates a real
program's.  Where no such driver loads (a real driver rejects the stand-in
module) or ``SIMULATED_SLEEP=1`` is set, a kernel is a sleep of the same
length.  ``--fail`` exits 3 without a result.  Standard library and
``krex_client`` only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

T_START = time.time()


class DurationKernels:
    """Duration kernels on device 0 of the fake CUDA driver, through ctypes.

    Raises ``OSError`` when ``libcuda.so.1`` cannot be loaded and
    ``RuntimeError`` (naming the call and its CUresult) when a driver call
    fails, e.g. a real driver refusing the stand-in module image.
    """

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._call("cuInit", ctypes.c_uint(0))
        ctx = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), ctypes.c_int(0))
        self._call("cuCtxSetCurrent", ctx)
        mod, self.func = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(b"duration kernels"))
        self._call("cuModuleGetFunction", ctypes.byref(self.func), mod, b"duration_kernel")

    def _call(self, name: str, *args: object) -> None:
        code = int(getattr(self.lib, name)(*args))
        if code != 0:
            raise RuntimeError(f"{name} failed: CUresult {code}")

    def run(self, duration_ns: int) -> None:
        """Launch one kernel of ``duration_ns`` ns on the default stream; wait for it."""
        dur = ctypes.c_uint64(duration_ns)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dur), ctypes.c_void_p))
        u1 = ctypes.c_uint(1)
        null = ctypes.c_void_p(None)
        self._call(
            "cuLaunchKernel",
            self.func,
            u1,
            u1,
            u1,
            u1,
            u1,
            u1,
            ctypes.c_uint(0),
            null,
            params,
            null,
        )
        self._call("cuCtxSynchronize")


def kernel_fn(us: float) -> Callable[[], None]:
    """A callable that runs one kernel of ``us`` µs to completion (a sleep without a driver)."""
    if os.environ.get("SIMULATED_SLEEP") != "1":
        try:
            kernels = DurationKernels()
        except (OSError, RuntimeError):  # no fake driver: fall back to sleeping
            pass
        else:
            return lambda: kernels.run(int(us * 1000))

    def run_sleep() -> None:
        time.sleep(us / 1e6)

    return run_sleep


def main() -> int:
    """Parse the arguments, time the kernels, print the result line; the exit code."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
