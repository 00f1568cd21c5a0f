"""Cost of the /proc reads krexd's fail-closed check makes, against one live CUDA process.

Starts ``python -c "import torch; ..."`` with the shim preloaded (pass-through:
no gate in its environment) and times, per call in µs, the reads the check
makes of a sibling process (docs/design/shim.md "Fail closed";
``krexd.tenancy.registrations``): the shim mapping's ``map_files`` link, a held
``stat`` read, a pidfd poll; and, for comparison, opening and reading a
/proc file and the cost of a bare system call.  Needs torch with CUDA and a
GPU (docs/bench/gate-v2-h200.md, round 5).

Usage: ``python3 benchmarks/proc_costs.py [--shim build/lib/libkrex_shim.so] [--calls N]``
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_CHILD = (
    "import torch,time; x=torch.zeros(1,device='cuda'); print('ok',flush=True); time.sleep(120)"
)


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    """Mean µs per call of ``fn`` over ``calls`` calls (after one warm-up call)."""
    fn()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def main(argv: list[str] | None = None) -> int:
    """Command line: print one line per operation."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", default=str(REPO / "build" / "lib" / "libkrex_shim.so"))
    ap.add_argument("--calls", type=int, default=2000, help="calls per operation")
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env["LD_PRELOAD"] = args.shim
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ok":
            raise SystemExit("the CUDA process did not start (torch with CUDA needed)")
        pid = child.pid
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
        span = next((ln.split()[0] for ln in lines if "libkrex_shim" in ln), None)
        if span is None:
            raise SystemExit(f"{args.shim} is not mapped in the CUDA process")
        threads = len(os.listdir(f"/proc/{pid}/task"))
        print(f"pid {pid}: {len(lines)} mappings, {threads} threads")
        stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        pidfd = os.pidfd_open(pid)
        maps_dir = os.open(f"/proc/{pid}/map_files", os.O_RDONLY | os.O_DIRECTORY)
        ops: list[tuple[str, Callable[[], object]]] = [
            (
                "readlink /proc/P/map_files/SPAN",
                lambda: os.readlink(f"/proc/{pid}/map_files/{span}"),
            ),
            ("readlink map_files dirfd + SPAN", lambda: os.readlink(span, dir_fd=maps_dir)),
            ("pread held /proc/P/stat", lambda: os.pread(stat_fd, 4096, 0)),
            ("open+read+close /proc/P/stat", lambda: Path(f"/proc/{pid}/stat").read_bytes()),
            ("poll pidfd", lambda: select.select([pidfd], [], [], 0)),
            ("open+read /proc/P/status", lambda: Path(f"/proc/{pid}/status").read_bytes()),
            ("stat /proc/P/ns/pid", lambda: os.stat(f"/proc/{pid}/ns/pid")),
            ("getppid (a bare system call)", os.getppid),
        ]
        for name, fn in ops:
            print(f"{name:<40}{per_call_us(fn, args.calls):8.2f} us")
        for fd in (stat_fd, pidfd, maps_dir):
            os.close(fd)
    finally:
        child.kill()
        child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
