"""Scheduling overhead of a command sent through Ray against a direct ``krex run``.

    sudo python benchmarks/ray_overhead.py [--iterations N] [--warmup W] [--json]

Starts a private krexd (``--fake-gpus 1``, 2 slots; needs root) and a
one-node Ray cluster on this machine whose node advertises that krexd
(``krex ray-resources``: ``krex_slot``, ``krex_host_<NAME>``, and
``KREX_SOCKET`` in the node's environment).  Then, alternating, one at a
time:

* direct: ``krex run -- true`` as a subprocess, timed from start to exit;
* Ray: ``krex_client.cluster.run(Command(["true"], region_log=False))`` from
  this driver: submission, Ray scheduling and dispatch to a worker, the same
  ``krex run -- true`` there, and the result back.

The per-command overhead is the Ray time minus the direct time; the report
gives p50/p90/p99 (ms) of both, of their difference, of the Ray part that
is queueing and dispatch (``Timings.queued_s``: submission to the task's
start) and of the task itself (its start to ``krex run``'s exit on the host:
the same ``krex run -- true`` plus the task's own work around it).  Warm-up
iterations (default 5 each) are not counted: the first Ray task also starts
a worker process.  Ray's files go to a temporary
directory (``RAY_TMPDIR``), removed afterwards with krexd's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from krex_cli import ray_resources
from krex_client import cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_krexd  # noqa: E402

KREX = [sys.executable, "-m", "krex_cli"]


def start_krexd(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    """A krexd with one fake GPU and 2 slot(s) on ``workdir/krexd.sock``, ready."""
    return fake_krexd.start_krexd(workdir, 2, "krexraybench")


def start_ray(socket: str) -> None:
    """A one-node Ray cluster advertising the krexd at ``socket`` (host ``bench``)."""
    import ray

    # The node's processes (and so the tasks) inherit this environment.
    os.environ.update(KREX_SOCKET=socket, KREX_HOST="bench", KREX_CLI=" ".join(KREX))
    ray.init(
        num_cpus=1,
        resources=ray_resources.query(socket, "bench"),
        object_store_memory=80 * 1024 * 1024,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
    )


def direct_ms() -> float:
    """One ``krex run -- true``, start to exit (ms)."""
    t0 = time.perf_counter()
    p = subprocess.run([*KREX, "run", "--", "true"], stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise SystemExit(f"krex run -- true exited {p.returncode}")
    return (time.perf_counter() - t0) * 1e3


def ray_ms() -> tuple[float, float, float]:
    """One command through Ray, in ms: (submission to result, submission to the task's start,
    the task's start to ``krex run``'s exit on the host)."""
    t0 = time.perf_counter()
    res = cluster.run(cluster.Command(["true"], region_log=False))
    took = (time.perf_counter() - t0) * 1e3
    if not res.ok:
        raise SystemExit(f"through Ray: exit {res.exit_code}: {res.stderr[-500:]}")
    t = res.timings
    return took, t.queued_s * 1e3, (t.ended - t.started) * 1e3


def percentiles(xs: list[float]) -> dict[str, float]:
    """p50/p90/p99/max of ``xs`` (ms, rounded to 0.01)."""
    s = sorted(xs)

    def pct(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))]

    return {
        "p50": round(statistics.median(s), 2),
        "p90": round(pct(0.90), 2),
        "p99": round(pct(0.99), 2),
        "max": round(s[-1], 2),
    }


def measure(iterations: int, warmup: int) -> dict[str, Any]:
    """Alternate direct and Ray runs; the figures (module docstring)."""
    for _ in range(warmup):
        direct_ms()
        ray_ms()
    direct, through, queued, task = [], [], [], []
    for _ in range(iterations):
        direct.append(direct_ms())
        took, q, ran = ray_ms()
        through.append(took)
        queued.append(q)
        task.append(ran)
    return {
        "iterations": iterations,
        "direct_ms": percentiles(direct),
        "ray_ms": percentiles(through),
        "overhead_ms": percentiles([r - d for r, d in zip(through, direct, strict=True)]),
        "ray_queued_ms": percentiles(queued),
        "ray_task_ms": percentiles(task),
        "cpus": os.cpu_count(),
    }


def main() -> int:
    """Run the benchmark; print a summary (and one JSON line with --json)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args()
    import ray

    workdir = tempfile.mkdtemp(prefix="krex-raybench-")
    os.chmod(workdir, 0o755)
    os.environ["RAY_TMPDIR"] = workdir
    proc, socket = start_krexd(workdir)
    try:
        start_ray(socket)
        result = measure(args.iterations, args.warmup)
    finally:
        ray.shutdown()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)
    result["ray_version"] = ray.__version__
    for key in ("direct_ms", "ray_ms", "overhead_ms", "ray_queued_ms", "ray_task_ms"):
        f = result[key]
        print(f"{key:14} p50 {f['p50']:8.2f}  p90 {f['p90']:8.2f}  p99 {f['p99']:8.2f}  ms")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
