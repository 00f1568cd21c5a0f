"""Soak over the fake driver: a burst of commands, a long row of them, and restarts under load.

Usage (root, from the source checkout after ``make``)::

    sudo .venv/bin/python benchmarks/soak.py OUT [--burst 300] [--sequential 2000]
        [--restarts 200] [--concurrency 8] [--kill-every 2,6] [--regions 2]

Starts its own krexd over one simulated GPU (the shipped config with a
private socket, state directory and cgroup name; the driver lock through
the fake driver, as on a real GPU) and runs ``benchmarks/soak_command.py``
(kernels outside and inside ``--regions`` critical regions) through
``krex run`` in three phases:

* ``burst``: ``--burst`` commands started at once;
* ``sequential``: ``--sequential`` commands, one after another;
* ``restarts``: ``--restarts`` commands, ``--concurrency`` at a time, while
  krexd is stopped every U(``--kill-every``) seconds, by SIGKILL or by
  SIGTERM at random, and started again 0.5-2 s later (systemd's
  ``RestartSec`` range); the restarted krexd adopts the running commands.

For each phase it prints: commands, lost (exit code not 0, or no result),
regions granted of those asked for, sibling kernels inside a region (the
fake driver's timeline of every process, checked against every region), and
krexd's RSS (MiB) at the phase's start and end and its maximum.  Writes
``OUT/summary.json``; exits 1 when a command was lost or a kernel ran inside
another's region.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "build" / "fakecuda"
COMMAND = REPO / "benchmarks" / "soak_command.py"
sys.path.insert(0, str(REPO / "tests" / "fakecuda"))
sys.path.insert(0, str(REPO / "python_client"))

import timeline  # noqa: E402


class Daemon:
    """The soak's krexd: started, stopped, restarted; its RSS sampled every 0.5 s."""

    def __init__(self, out: Path, socket: str) -> None:
        self.out, self.socket = out, socket
        self.proc: subprocess.Popen[bytes] | None = None
        self.rss: list[float] = []  # MiB, samples of the current process
        self.stops: list[tuple[float, str]] = []  # (wall s, signal) of each stop
        self.lock = threading.Lock()
        threading.Thread(target=self._sample, daemon=True).start()

    def start(self) -> None:
        env = dict(
            os.environ,
            KREX_FAKE_STATE=str(self.out / "fakestate"),
            KREX_DRIVER_LIB=str(FAKE / "libcuda.so.1"),
            PYTHONPATH=f"{REPO}:{REPO / 'python_client'}",
        )
        with open(self.out / "krexd.log", "ab") as log, self.lock:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "krexd", "--foreground",
                 "--config", str(self.out / "krexd.toml")],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
            )  # fmt: skip
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 60.0) -> None:
        from krex_client.connection import Connection, KrexUnavailable

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with Connection(self.socket, timeout_s=1.0) as c:
                    c.request("ping")
                return
            except KrexUnavailable:
                time.sleep(0.1)
        raise SystemExit(f"krexd not ready on {self.socket}; see {self.out}/krexd.log")

    def stop(self, sig: int) -> None:
        """SIGKILL: a crash.  SIGTERM: a restart, as ``systemctl restart`` makes one
        (``krexd --prepare-restart`` first; a bare SIGTERM is a stop, which ends commands)."""
        if sig == signal.SIGTERM:
            subprocess.run(
                [sys.executable, "-m", "krexd", "--config", str(self.out / "krexd.toml"),
                 "--prepare-restart"],
                cwd=REPO, env=dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'python_client'}"),
                check=True, capture_output=True,
            )  # fmt: skip
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is not None:
            proc.send_signal(sig)
            proc.wait(60)
        self.stops.append((time.time(), signal.Signals(sig).name))

    def shutdown(self) -> None:
        """A stop (SIGTERM, no restart prepared): krexd ends what runs and removes its tree."""
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)

    def _sample(self) -> None:
        while True:
            proc = self.proc
            try:
                if proc is not None:
                    self.rss.append(psutil.Process(proc.pid).memory_info().rss / 2**20)
            except psutil.Error:
                pass
            time.sleep(0.5)


def run_one(env: dict[str, str], out: Path, i: int, regions: int) -> dict[str, Any]:
    """One ``krex run`` of the soak command; its exit code and result."""
    res = out / "results" / f"{i}.json"
    argv = [sys.executable, "-m", "krex_cli", "run", "--", sys.executable, str(COMMAND)]
    t0 = time.time()
    p = subprocess.run(
        [*argv, str(regions), str(res)],
        env=env, capture_output=True, timeout=900, cwd=REPO,
    )  # fmt: skip
    row: dict[str, Any] = {"i": i, "rc": p.returncode, "err": p.stderr.decode()[-2000:]}
    row["t"] = [t0, time.time()]
    if res.exists():
        row.update(json.loads(res.read_text()))
    return row


def violations(rows: list[dict[str, Any]], records: list[timeline.Record]) -> int:
    """Kernels of any other process inside any command's region (sorted sweep)."""
    recs = sorted(records, key=lambda r: r.start_ns)
    starts = [r.start_ns for r in recs]
    longest = max((r.duration_ns for r in recs), default=0)
    n = 0
    for row in rows:
        for s, e in row.get("regions", []):
            lo = bisect.bisect_left(starts, s - longest)
            hi = bisect.bisect_left(starts, e)
            n += sum(1 for r in recs[lo:hi] if r.pid != row["pid"] and r.end_ns > s)
    return n


def phase(
    name: str, daemon: Daemon, rows: list[dict[str, Any]], regions: int, t0: float
) -> dict[str, Any]:
    lost = [r for r in rows if r["rc"] != 0 or "regions" not in r]
    rss = daemon.rss or [0.0]
    quarters = [round(rss[min(len(rss) - 1, len(rss) * q // 4)], 1) for q in range(1, 4)]
    return {
        "rss_quarters_mib": quarters,  # at 1/4, 1/2 and 3/4 of the phase
        "phase": name,
        "commands": len(rows),
        "lost": len(lost),
        "regions": sum(len(r.get("regions", [])) for r in rows),
        "regions_asked": regions * len(rows),
        "rss_start_mib": round(rss[0], 1),
        "rss_end_mib": round(rss[-1], 1),
        "rss_max_mib": round(max(rss), 1),
        "seconds": round(time.monotonic() - t0, 1),
        "lost_examples": [(r["rc"], r["err"][-200:]) for r in lost[:3]],
    }


def restarts(daemon: Daemon, stop: threading.Event, lo: float, hi: float, log: list[Any]) -> None:
    rng = random.Random(7)
    while not stop.wait(rng.uniform(lo, hi)):
        sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
        daemon.stop(sig)
        time.sleep(rng.uniform(0.5, 2.0))
        daemon.start()
        log.append(signal.Signals(sig).name)  # restarted


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--burst", type=int, default=300)
    p.add_argument("--sequential", type=int, default=2000)
    p.add_argument("--restarts", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kill-every", default="2,6", help="seconds between stops: LO,HI")
    p.add_argument("--regions", type=int, default=2, help="regions per command")
    args = p.parse_args()
    out: Path = args.out.resolve()
    (out / "results").mkdir(parents=True, exist_ok=True)
    socket = str(out / "krexd.sock")
    shipped = (REPO / "etc/krex.toml").read_text()
    (out / "krexd.toml").write_text(
        shipped.replace('socket = "/run/krex/krexd.sock"', f'socket = "{socket}"')
        .replace('name = "krex"', 'name = "krex-soak"')
        .replace("allow_shared = false", "allow_shared = true")
        .replace("fake_gpus = 0", "fake_gpus = 1")
    )
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO}:{REPO / 'python_client'}",
        KREX_SOCKET=socket,
        LD_LIBRARY_PATH=str(FAKE),
        KREX_FAKE_TIMELINE=str(out / "timeline"),
        KREX_FAKE_STATE=str(out / "fakestate"),
    )
    daemon = Daemon(out, socket)
    daemon.start()
    summary: list[dict[str, Any]] = []
    all_rows: list[dict[str, Any]] = []
    n = 0
    plan = [("burst", args.burst, args.burst), ("sequential", args.sequential, 1),
            ("restarts", args.restarts, args.concurrency)]  # fmt: skip
    for name, count, workers in plan:
        if not count:
            continue
        stop, stops = threading.Event(), []
        killer = None
        if name == "restarts":
            lo, hi = (float(x) for x in args.kill_every.split(","))
            killer = threading.Thread(target=restarts, args=(daemon, stop, lo, hi, stops))
            killer.start()
        daemon.rss = []
        t0 = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            rows = list(pool.map(lambda i: run_one(env, out, i, args.regions), range(n, n + count)))
        n += count
        stop.set()
        if killer is not None:
            killer.join()
        row = phase(name, daemon, rows, args.regions, t0)
        row["krexd_stops"] = stops
        summary.append(row)
        all_rows += rows
        print(json.dumps({k: v for k, v in row.items() if k != "lost_examples"}), flush=True)
    daemon.shutdown()
    with open(out / "rows.jsonl", "w") as f:
        for r in all_rows:
            f.write(json.dumps(r) + "\n")
    (out / "stops.json").write_text(json.dumps(daemon.stops))
    inside = violations(all_rows, timeline.read(out / "timeline"))
    print("| phase | commands | lost | regions granted/asked | krexd stops ", end="")
    print("| RSS start/end/max MiB | s |")
    print("|---|---|---|---|---|---|---|")
    for r in summary:
        print(
            f"| {r['phase']} | {r['commands']} | {r['lost']} "
            f"| {r['regions']}/{r['regions_asked']} | {len(r['krexd_stops'])} "
            f"| {r['rss_start_mib']}/{r['rss_end_mib']}/{r['rss_max_mib']} | {r['seconds']} |"
        )
    print(f"sibling kernels inside a region, all phases: {inside}")
    (out / "summary.json").write_text(json.dumps({"phases": summary, "inside": inside}, indent=1))
    lost = sum(r["lost"] for r in summary)
    return 0 if lost == 0 and inside == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
