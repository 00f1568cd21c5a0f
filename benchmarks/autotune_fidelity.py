"""Does Triton's autotuner pick the serial winner when 8 commands tune at once?

Paper §4.1: an autotuner profiles internally, without marking anything.
This benchmark starts a private krexd, finds the configuration that
``workloads/autotune_matmul.py`` picks when it tunes alone (``--serial``
runs, one at a time; the serial winner is the configuration most of them
picked), then runs trials of ``--commands`` copies at once through
``krex run``:

* **auto-regions**: ``KREX_AUTOREGION=1`` — the autotuner's measurements
  run in critical regions (krex_client.implicit): each tuning step in one
  region, or with ``--tuning-region config`` each configuration in its own
  (``KREX_AUTOTUNE_REGION``, krex_client.tuning_step); a step's
  configurations timed interleaved, or with ``--order sequential`` in turn
  (``KREX_AUTOTUNE_ORDER``);
* **unprotected**: the same commands without it — admitted by krex, but
  their measurements share the GPU with the siblings'.

It prints, per mode, how many trials had every command pick the serial
winner and how many picks matched in all, plus the regions krexd granted;
each command's gap between its two fastest configurations; and, from the
region records (docs/design/region-log.md, one log per mode), the SM clock
at entry and when each timed region's code began (after the clock
warm-up), what the warm-up did, and per command the spread of the clocks
its configurations were timed at.

    python3 benchmarks/autotune_fidelity.py --trials 10 --unprotected-trials 5 \\
        [--configs wide] [--warm-ms 100] [--warm-kind memset] --json OUT.json

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
_MODES = ("auto-regions", "unprotected")
CONFIG_SETS = ("default", "wide")
"""``workloads/autotune_matmul.py``'s configuration sets (its second argument)."""


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


def gap_pct(ranked: list[list[Any]]) -> float | None:
    """Gap between the two fastest configurations, percent of the fastest
    (``ranked``: ``[[ms, config], ...]`` fastest first); None with fewer than two."""
    if len(ranked) < 2 or not ranked[0][0] > 0:
        return None
    return 100.0 * (float(ranked[1][0]) - float(ranked[0][0])) / float(ranked[0][0])


def _round(
    socket: str, n: int, autoregion: bool, args: argparse.Namespace, log: str = ""
) -> list[dict[str, Any]]:
    """Run ``n`` tuning commands at once; per command ``{pick, pid, gap_pct, ranked}``
    (``pick`` '' on failure).  With ``log``, every region's record is appended there."""
    env = dict(_clean_env(), KREX_SOCKET=socket)
    if autoregion:
        env["KREX_AUTOREGION"] = "1"
        env["KREX_AUTOTUNE_REGION"] = args.tuning_region
        env["KREX_AUTOTUNE_ORDER"] = args.order
    if log:
        env["KREX_REGION_LOG"] = log
    if args.warm_ms is not None:
        env["KREX_REGION_WARM_MS"] = str(args.warm_ms)
    if args.warm_kind:
        env["KREX_REGION_WARM_KIND"] = args.warm_kind
    if args.warm_pct is not None:
        env["KREX_REGION_WARM_PCT"] = str(args.warm_pct)
    argv = [sys.executable, WORKLOAD, str(args.size), args.configs]
    procs = [
        subprocess.Popen(
            [*KREX, "run", "--", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    out_list = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        obj = json.loads(lines[-1]) if lines else {}
        ranked = obj.get("ranked") or []
        cmd = {"pick": obj.get("config", ""), "pid": obj.get("pid"), "ranked": ranked}
        cmd["gap_pct"] = gap_pct(ranked)
        if not cmd["pick"]:
            sys.stderr.write(f"a command failed (exit {p.returncode}): {err[-400:]}\n")
        out_list.append(cmd)
    return out_list


def _spread(values: list[float]) -> dict[str, float] | None:
    """``{min, median, max, n}`` of ``values``; None when empty."""
    if not values:
        return None
    v = sorted(values)
    return {"min": v[0], "median": v[len(v) // 2], "max": v[-1], "n": len(v)}


def _start_clock(rec: dict[str, Any]) -> Any:
    """The SM clock when the region's code began: after the warm-up (``warmed``)."""
    return (rec.get("warmed") or {}).get(
        "sm_clock_mhz", (rec.get("entry") or {}).get("sm_clock_mhz")
    )


def region_summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """What one mode's region records say (docs/design/region-log.md).

    Keys: ``regions``; ``warnings`` (count per kind); ``entry_mhz`` and
    ``start_mhz`` (the SM clock at entry, and when the region's code began:
    :func:`_spread`); ``start_below_pct`` (regions whose code began below 80%
    and 90% of the maximum); ``warmup`` (``kind`` and ``stop`` counts, ``ms``
    spread); ``per_command_start_spread_mhz`` (per holder process, the
    highest start clock minus the lowest: how far apart the clocks its
    configurations were timed at lie).
    """
    num = (int, float)
    entry = [c for r in recs if isinstance(c := (r.get("entry") or {}).get("sm_clock_mhz"), num)]
    start = [c for r in recs if isinstance(c := _start_clock(r), num)]
    tops = [
        t for r in recs if isinstance(t := (r.get("device") or {}).get("sm_clock_max_mhz"), num)
    ]
    top = max(tops) if tops else None
    by_pid: dict[Any, list[float]] = collections.defaultdict(list)
    for r in recs:
        if isinstance(c := _start_clock(r), num):
            by_pid[r.get("pid")].append(c)
    warm = [r.get("warmup") or {} for r in recs]
    return {
        "regions": len(recs),
        "warnings": dict(
            collections.Counter(w.get("kind") for r in recs for w in r.get("warnings") or [])
        ),
        "sm_clock_max_mhz": top,
        "entry_mhz": _spread(entry),
        "start_mhz": _spread(start),
        "start_below_pct": {
            str(pct): sum(c < pct / 100 * top for c in start) if top else None for pct in (80, 90)
        },
        "warmup": {
            "kind": dict(collections.Counter(w.get("kind", "?") for w in warm)),
            "stop": dict(collections.Counter(w.get("stop", "?") for w in warm)),
            "ms": _spread([float(w["ms"]) for w in warm if w.get("ms")]),
        },
        "per_command_start_spread_mhz": _spread([max(c) - min(c) for c in by_pid.values()]),
    }


def _read_records(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.startswith("{")]


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


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--commands", type=int, default=8)
    ap.add_argument("--trials", type=int, default=10, help="trials with auto-regions")
    ap.add_argument("--unprotected-trials", type=int, default=5)
    ap.add_argument("--serial", type=int, default=3, help="tuning runs alone, for the reference")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument(
        "--configs", choices=CONFIG_SETS, default="default", help="the workload's config set"
    )
    ap.add_argument("--warm-ms", type=float, default=None, help="KREX_REGION_WARM_MS for all")
    ap.add_argument("--warm-kind", choices=("auto", "memset"), default="")
    ap.add_argument(
        "--warm-pct", type=float, default=None, help="KREX_REGION_WARM_PCT for all (100: budget)"
    )
    ap.add_argument(
        "--tuning-region",
        choices=("step", "config"),
        default="step",
        help="KREX_AUTOTUNE_REGION: one region per tuning step (default) or per configuration",
    )
    ap.add_argument(
        "--order",
        choices=("interleaved", "sequential"),
        default="interleaved",
        help="KREX_AUTOTUNE_ORDER: a step's configurations timed interleaved (default) or in turn",
    )
    ap.add_argument("--fake-gpus", type=int, default=0)
    ap.add_argument("--json", default="")
    return ap.parse_args()


def _run(args: argparse.Namespace, workdir: str, socket: str) -> dict[str, Any]:
    """Serial reference, then the interleaved trials; the raw results."""
    logs = {m: os.path.join(workdir, f"regions-{m}.jsonl") for m in ("serial", *_MODES)}
    per_command: dict[str, list[list[dict[str, Any]]]] = {"serial": []}
    for _ in range(args.serial):
        per_command["serial"].append(_round(socket, 1, True, args, logs["serial"]))
    serial = [t[0]["pick"] for t in per_command["serial"]]
    winner, _ = collections.Counter(serial).most_common(1)[0]
    regions = dict.fromkeys(_MODES, 0)
    for mode in _MODES:
        per_command[mode] = []
    for mode in _interleave(args.trials, args.unprotected_trials):
        before, t = _granted(socket), time.monotonic()
        cmds = _round(socket, args.commands, mode == "auto-regions", args, logs[mode])
        regions[mode] += _granted(socket) - before
        per_command[mode].append(cmds)
        hits = sum(c["pick"] == winner for c in cmds)
        print(
            f"{mode:13s} {hits}/{len(cmds)} picked the serial winner "
            f"({time.monotonic() - t:.0f} s)",
            flush=True,
        )
    return {
        "serial": serial,
        "winner": winner,
        "trials": {m: [[c["pick"] for c in t] for t in per_command[m]] for m in _MODES},
        "regions": regions,
        "margins_pct": {
            m: [c["gap_pct"] for t in trials for c in t if c["gap_pct"] is not None]
            for m, trials in per_command.items()
        },
        "per_command": per_command,
        "region_summary": {m: region_summary(_read_records(p)) for m, p in logs.items()},
    }


def _print(result: dict[str, Any]) -> None:
    winner = result["winner"]
    print(f"\nserial winner: {winner}  (serial runs: {collections.Counter(result['serial'])})")
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
    print("\ngap between each command's two fastest configurations (% of the fastest):")
    for mode, trials in result["per_command"].items():
        gaps = [
            f"{c['gap_pct']:.2f}{'' if c['pick'] == winner else '*'}"
            for t in trials
            for c in t
            if c["gap_pct"] is not None
        ]
        s = _spread([c["gap_pct"] for t in trials for c in t if c["gap_pct"] is not None])
        if s:
            print(f"  {mode:13s} median {s['median']:.2f}, min {s['min']:.2f}, max {s['max']:.2f}")
            print(f"  {'':13s} per command (* missed the winner): {' '.join(gaps)}")
    print("\nregion records (SM clock in MHz; start: when the region's code began):")
    for mode, s in result["region_summary"].items():
        _print_regions(mode, s)


def _print_regions(mode: str, s: dict[str, Any]) -> None:
    if not s["regions"]:
        print(f"  {mode:13s} no regions")
        return

    def fmt(sp: dict[str, float] | None, unit: str = "") -> str:
        return "n/a" if not sp else f"{sp['min']:g}/{sp['median']:g}/{sp['max']:g}{unit}"

    below = s["start_below_pct"]
    print(
        f"  {mode:13s} {s['regions']} regions (max {s['sm_clock_max_mhz']}); "
        f"entry min/median/max {fmt(s['entry_mhz'])}; start {fmt(s['start_mhz'])}; "
        f"start below 80%: {below['80']}, below 90%: {below['90']}"
    )
    w = s["warmup"]
    print(
        f"  {'':13s} warm-up kinds {w['kind']}, stops {w['stop']}, ms {fmt(w['ms'])}; "
        f"per-command start-clock spread {fmt(s['per_command_start_spread_mhz'])}; "
        f"warnings {s['warnings'] or 'none'}"
    )


def main() -> int:
    """Serial reference, then alternating trials of both modes; prints a table."""
    args = _args()
    workdir = tempfile.mkdtemp(prefix="krex-autotune-")
    krexd, socket = _start_krexd(workdir, args.commands, args.fake_gpus)
    result: dict[str, Any] = {
        "commands": args.commands,
        "size": args.size,
        "configs": args.configs,
        "warm_ms": args.warm_ms,
        "warm_kind": args.warm_kind or "auto",
        "warm_pct": args.warm_pct,
        "tuning_region": args.tuning_region,
        "order": args.order,
        "workdir": workdir,
    }
    try:
        result.update(_run(args, workdir, socket))
    finally:
        _stop(krexd)
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
