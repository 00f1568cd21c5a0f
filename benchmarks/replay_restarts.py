"""A krex-mode replay during which krexd is SIGKILLed and restarted: no command may be lost.

Usage (root, on a GPU host, from the source checkout after ``make``)::

    sudo .venv/bin/python benchmarks/replay_restarts.py TRACE OUT \\
        [--duration 300] [--concurrency 12] [--kills 60,180] [--reference RUN_DIR]

Starts its own krexd (config ``OUT/krexd.toml``: the shipped one with a
private socket, state directory and cgroup name), runs ``krex replay TRACE
--mode krex --socket ... --warm off`` (cold starts, as the reference's)
against it, SIGKILLs krexd at each ``--kills`` second (from the replay's
start) and starts it again 2 s later (systemd's ``RestartSec``), then
prints a short table:

* commands run, completed with exit 0, failed (any other code) — with a
  restart losing nothing, ``failed`` is the same as in a run without kills;
* for (task, candidate) pairs also in ``--reference`` (a krex-mode run
  directory, default docs/bench/replay-h200/runs/3-krex): the ratio of
  median times, p50/p90 and the share within the usual ±5 % band, per band.

``docs/bench/`` gets its output; the krexd log is ``OUT/krexd.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def start_krexd(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "krexd", "--foreground", "--config", str(config)],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    return proc


def wait_ready(socket: str, timeout_s: float = 120.0) -> None:
    sys.path.insert(0, str(REPO / "python_client"))
    from krex_client.connection import Connection, KrexUnavailable

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with Connection(socket, timeout_s=1.0) as c:
                c.request("ping")
            return
        except KrexUnavailable:
            time.sleep(0.2)
    raise SystemExit(f"krexd not ready on {socket}")


def results(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def medians(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, float]]:
    by: dict[tuple[str, str], list[float]] = {}
    band: dict[tuple[str, str], str] = {}
    for r in rows:
        res = r.get("result") or {}
        if r.get("exit_code") == 0 and res.get("median_ms"):
            key = (r["task"], r["candidate"])
            by.setdefault(key, []).append(float(res["median_ms"]))
            band[key] = r.get("band", "?")
    return {k: (band[k], statistics.median(v)) for k, v in by.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("out", type=Path)
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--kills", default="60,180", help="seconds after the start, comma-separated")
    p.add_argument("--reference", type=Path, default=REPO / "docs/bench/replay-h200/runs/3-krex")
    args = p.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    socket = str(out / "krexd.sock")
    shipped = (REPO / "etc/krex.toml").read_text()
    config = out / "krexd.toml"
    config.write_text(
        shipped.replace('socket = "/run/krex/krexd.sock"', f'socket = "{socket}"')
        .replace('name = "krex"', 'name = "krex-restarts"')
        # krexd's slots match the replay's workers (the shipped config derives them).
        .replace('\nslots_per_gpu = "auto"\n', f"\nslots_per_gpu = {args.concurrency}\n")
    )
    log = out / "krexd.log"
    krexd = start_krexd(config, log)
    wait_ready(socket)
    path = os.pathsep.join(
        x for x in (str(REPO), str(REPO / "python_client"), os.environ.get("PYTHONPATH")) if x
    )
    env = dict(os.environ, PYTHONPATH=path, KREX_SOCKET=socket)
    replay = subprocess.Popen(
        [sys.executable, "-m", "krex_cli", "replay", args.trace, "--mode", "krex",
         "--concurrency", str(args.concurrency), "--duration", str(args.duration),
         "--socket", socket, "--no-progress", "--no-report", "--out", str(out / "run"),
         "--warm", "off"],  # cold starts, as the reference run's
        cwd=REPO, env=env, stdout=open(out / "replay.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    t0 = time.monotonic()
    kills: list[tuple[float, float]] = []
    for at in sorted(float(x) for x in args.kills.split(",") if x):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        if replay.poll() is not None:
            break
        krexd.send_signal(signal.SIGKILL)
        krexd.wait()
        killed = time.monotonic() - t0
        time.sleep(2.0)  # systemd's RestartSec
        krexd = start_krexd(config, log)
        wait_ready(socket)
        kills.append((killed, time.monotonic() - t0))
    rc = replay.wait()
    krexd.send_signal(signal.SIGTERM)
    krexd.wait(60)
    rows = results(out / "run")
    ok = sum(1 for r in rows if r.get("exit_code") == 0)
    print(f"replay rc={rc}; krexd SIGKILLed/serving again at (s): {kills}")
    print("| commands | exit 0 | failed | adopted (krexd log) |")
    adopted = log.read_text(errors="replace").count("adopted ")
    print(f"| {len(rows)} | {ok} | {len(rows) - ok} | {adopted} |")
    if args.reference.is_dir():
        ref, now = medians(results(args.reference)), medians(rows)
        per_band: dict[str, list[float]] = {}
        for key, (band, m) in now.items():
            if key in ref and ref[key][1] > 0:
                per_band.setdefault(band, []).append(m / ref[key][1])
        print("| band | pairs | ratio p50 | ratio p90 | within ±5 % |")
        for band, ratios in sorted(per_band.items()):
            ratios.sort()
            p90 = ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))]
            within = sum(1 for x in ratios if abs(x - 1) <= 0.05) / len(ratios)
            print(
                f"| {band} | {len(ratios)} | {statistics.median(ratios):.3f} | {p90:.3f} "
                f"| {within:.0%} |"
            )
    (out / "summary.json").write_text(
        json.dumps({"rc": rc, "kills": kills, "commands": len(rows), "ok": ok}, indent=1)
    )
    return 0 if rc == 0 and kills else 1


if __name__ == "__main__":
    sys.exit(main())
