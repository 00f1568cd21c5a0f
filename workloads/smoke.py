"""Run every candidate of the corpus once at its small ``smoke`` shape; print a table.

A quick check of each candidate's code path (imports, compilation,
correctness) before a replay, e.g. on a fresh GPU host (it also fills the
Triton, torch.compile and extension caches).  On a machine without a GPU
use ``--device cpu`` (Triton runs in its interpreter; CUDA-only candidates
are reported as skipped).  Exit code 1 when any candidate fails.

    python workloads/smoke.py [--device cpu] [--jobs 8] [--family gemm ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import corpus
from harness import EXIT_UNSUPPORTED


def run_one(c: dict[str, Any], device: str, timeout: float) -> tuple[dict[str, Any], str, str]:
    """(command, status, detail): status is ok, incorrect, skipped or failed."""
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    argv = [
        sys.executable,
        str(corpus.HERE / f"{c['family']}.py"),
        "--task",
        c["task"],
        "--candidate",
        c["candidate"],
        "--smoke",
        "--device",
        device,
    ]
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return c, "failed", f"timed out after {timeout:g} s"
    if p.returncode == EXIT_UNSUPPORTED:
        return c, "skipped", p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()
        return c, "failed", tail[-1] if tail else f"exit code {p.returncode}"
    res = json.loads(p.stdout.strip().splitlines()[-1])
    status = "ok" if res.get("correct") else "incorrect"
    return c, status, f"max_abs_err={res.get('max_abs_err')}"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--family", action="append", choices=corpus.FAMILIES)
    a = p.parse_args()
    cmds = [c for c in corpus.commands() if not a.family or c["family"] in a.family]
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(lambda c: run_one(c, a.device, a.timeout), cmds))
    counts: dict[str, int] = {}
    for c, status, detail in results:
        counts[status] = counts.get(status, 0) + 1
        print(f"{status:9} {c['task']:38} {c['candidate']:26} {detail}")
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 1 if counts.get("failed") or counts.get("incorrect") else 0


if __name__ == "__main__":
    sys.exit(main())
