"""Does Triton's autotuner pick the serial winner when 8 commands tune at once?

Paper §4.1: an autotuner profiles internally, without marking anything.
This benchmark starts a private krexd, finds the configuration that
``workloads/autotune_matmul.py`` picks when it tunes alone (``--serial``
runs, one at a time), then runs trials of ``--commands`` copies at once
through ``krex run``:

* **auto-regions**: ``KREX_AUTOREGION=1`` — every ``do_bench`` the
  autotuner makes runs in a critical region (krex_client.implicit);
* **unprotected**: the same commands without it — admitted by krex, but
  their measurements share the GPU with the siblings'.

It prints, per mode, how many trials had every command pick the serial
winner and how many picks matched in all, plus the regions krexd granted.

    python3 benchmarks/autotune_fidelity.py --fake-gpus 0 --trials 10 --unprotected-trials 5

Needs a GPU with PyTorch and Triton, and root (krexd manages cgroups).
``KREX_AUTOREGION`` reaches scripts that never import krex_client through
``krex_client-autoregion.pth`` (installed with krex-client); with krex_client
only on PYTHONPATH, put that file in a site-packages directory first.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "python_client")]

from region_latency import KREX, _clean_env, _start_krexd, _stop  # noqa: E402

from krex_client.connection import Connection  # noqa: E402

WORKLOAD = str(REPO / "workloads" / "autotune_matmul.py")


def _granted(socket: str) -> int:
    """Regions krexd has granted so far on every GPU (status)."""
    conn = Connection(socket, timeout_s=5)
    try:
        st = conn.request("status")
    finally:
        conn.close()
    return sum(
        int(((g.get("region") or {}).get("regions") or {}).get("granted", 0)) for g in st["gpus"]
    )


def _round(
    socket: str, n: int, autoregion: bool, size: int, margins: list[float], log: str = ""
) -> list[str]:
    """Run ``n`` tuning commands at once; the configuration each picked ('' on failure).

    Appends to ``margins`` each command's gap between its two fastest
    configurations (percent of the fastest).  With ``log``, every region's
    record (docs/design/region-log.md) is appended there.
    """
    env = dict(_clean_env(), KREX_SOCKET=socket)
    if autoregion:
        env["KREX_AUTOREGION"] = "1"
    if log:
        env["KREX_REGION_LOG"] = log
    procs = [
        subprocess.Popen(
            [*KREX, "run", "--", sys.executable, WORKLOAD, str(size)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    picks = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        out_obj = json.loads(lines[-1]) if lines else {}
        pick = out_obj.get("config", "")
        ranked = out_obj.get("ranked") or []
        if len(ranked) >= 2 and ranked[0][0] > 0:
            margins.append(100.0 * (ranked[1][0] - ranked[0][0]) / ranked[0][0])
        if not pick:
            sys.stderr.write(f"a command failed (exit {p.returncode}): {err[-400:]}\n")
        picks.append(pick)
    return picks


def _summarize_regions(path: str) -> None:
    """Print what the region records say: count, warnings, SM clock at entry."""
    if not os.path.exists(path):
        print("no region records")
        return
    recs = [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.startswith("{")]
    warnings = collections.Counter(w.get("kind") for r in recs for w in r.get("warnings") or [])
    clocks = sorted(
        c for r in recs if isinstance(c := (r.get("entry") or {}).get("sm_clock_mhz"), int | float)
    )
    print(f"region records: {len(recs)}; warnings: {dict(warnings) or 'none'}")
    if clocks:
        print(
            f"SM clock at entry (MHz): min {clocks[0]}, median {clocks[len(clocks) // 2]}, "
            f"max {clocks[-1]}"
        )


def _interleave(protected: int, unprotected: int) -> list[str]:
    """Trial modes alternating while both remain, so that drift favours neither."""
    plan: list[str] = []
    while protected or unprotected:
        if protected:
            plan.append("auto-regions")
            protected -= 1
        if unprotected:
            plan.append("unprotected")
            unprotected -= 1
    return plan


def main() -> int:
    """Serial reference, then alternating trials of both modes; prints a table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commands", type=int, default=8)
    ap.add_argument("--trials", type=int, default=10, help="trials with auto-regions")
    ap.add_argument("--unprotected-trials", type=int, default=5)
    ap.add_argument("--serial", type=int, default=3, help="tuning runs alone, for the reference")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--fake-gpus", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="krex-autotune-")
    krexd, socket = _start_krexd(workdir, args.commands, args.fake_gpus)
    result: dict[str, Any] = {"commands": args.commands, "size": args.size}
    try:
        margins: dict[str, list[float]] = {"serial": [], "auto-regions": [], "unprotected": []}
        serial = [
            _round(socket, 1, True, args.size, margins["serial"])[0] for _ in range(args.serial)
        ]
        winner, _ = collections.Counter(serial).most_common(1)[0]
        result.update(serial=serial, winner=winner)
        modes = {"auto-regions": [], "unprotected": []}
        regions = {"auto-regions": 0, "unprotected": 0}
        plan = _interleave(args.trials, args.unprotected_trials)
        for mode in plan:
            before = _granted(socket)
            t = time.monotonic()
            log = os.path.join(workdir, "regions.jsonl")
            picks = _round(
                socket, args.commands, mode == "auto-regions", args.size, margins[mode], log
            )
            regions[mode] += _granted(socket) - before
            modes[mode].append(picks)
            hits = sum(p == winner for p in picks)
            print(
                f"{mode:13s} {hits}/{len(picks)} picked the serial winner "
                f"({time.monotonic() - t:.0f} s)",
                flush=True,
            )
        result["trials"] = modes
        result["regions"] = regions
        result["margins_pct"] = margins
    finally:
        _stop(krexd)
    print(f"\nserial winner: {winner}  (serial runs: {collections.Counter(serial)})")
    header = ("mode", "trials", "all picked it", "picks matching", "regions")
    print("{:13s} {:>6s} {:>13s} {:>15s} {:>8s}".format(*header))
    for mode, trials in result["trials"].items():
        all_ok = sum(all(p == winner for p in t) for t in trials)
        picks = sum(p == winner for t in trials for p in t)
        total = sum(len(t) for t in trials)
        print(
            f"{mode:13s} {len(trials):6d} {all_ok:>10d}/{len(trials):<2d} "
            f"{picks:>10d}/{total:<4d} {result['regions'][mode]:8d}"
        )
    for mode, m in result.get("margins_pct", {}).items():
        if m:
            m = sorted(m)
            print(
                f"{mode:13s} gap between the two fastest configurations: median "
                f"{m[len(m) // 2]:.2f}%, min {m[0]:.2f}%, max {m[-1]:.2f}%"
            )
    _summarize_regions(os.path.join(workdir, "regions.jsonl"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
