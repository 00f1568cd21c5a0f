"""How long N commands started at once take to import torch and create their CUDA context.

Each command is ``benchmarks/context_probe.py``: a Python process that
reports, in seconds since a start timestamp common to the whole batch, when
its first line ran, when ``import torch`` was done and when its first CUDA
operation (``torch.zeros(1, device="cuda")``, synchronized) was done.
``--workload fake`` replaces torch with ``import ctypes`` and the driver API
through ctypes (the fake driver of tests/fakecuda, for a smoke test without
a GPU).  Modes (``--modes``):

* ``native``: ``python context_probe.py ...`` directly;
* ``krex``: ``krex run -- python context_probe.py ...`` against a running
  krexd (``--socket``, else ``$KREX_SOCKET``);
* ``krex-mps``: the same against a krexd started with ``[mps] enabled =
  true`` (``--mps-socket``, default ``--socket``); the probes report whether
  they ran as MPS clients, and the table warns when they did not;
* ``warm``: ``krex run --warm -- ...``; reported as unavailable when this
  ``krex run`` does not know ``--warm``.

For each N of ``--counts`` and each mode (modes interleaved, ``--repeats``
times), N commands start at once; the table gives per mode and N the p50
and p95 over the commands of: start (until the script's first line), import,
first CUDA operation (from the import's end) and total (start to first
operation done).  ``--json OUT`` writes every command's raw figures.

    python3 benchmarks/context_creation.py --counts 1,12,32 --modes native,krex,warm \\
        --socket /run/krex/krexd.sock --json ctx.json

krexd must have at least max(N) slots per GPU (``[admission] slots_per_gpu``),
or the later commands wait for admission and the figures measure queueing.
docs/bench/context-creation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROBE = str(REPO / "benchmarks" / "context_probe.py")
MODES = ("native", "krex", "krex-mps", "warm")
PHASES = ("start", "import", "first_op", "total")


def _counts(text: str) -> list[int]:
    counts = [int(c) for c in text.split(",") if c.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("counts must be positive integers, e.g. 1,12,32")
    return counts


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = sorted(set(modes) - set(MODES))
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; not {', '.join(bad)}")
    return modes


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated; NaN when empty."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def phases(result: dict[str, float]) -> dict[str, float]:
    """A probe's times as durations: ``start`` (to its first line), ``import``,
    ``first_op`` (after the import) and ``total`` (start to first operation done)."""
    return {
        "start": result["interp"],
        "import": result["imported"] - result["interp"],
        "first_op": result["first_op"] - result["imported"],
        "total": result["first_op"],
    }


def warm_supported(krex: list[str], env: dict[str, str]) -> bool:
    """Whether ``krex run`` knows ``--warm`` (its ``--help`` names it)."""
    p = subprocess.run(
        [*krex, "run", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    return p.returncode == 0 and "--warm" in p.stdout


class Bench:
    """Runs batches of probes for one configuration (argv and environments)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # Not a krexd's or tenant's variables this script may run under (they would
        # point krex run elsewhere); the fake driver's (KREX_FAKE_*) stay.
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("KREX_") or k.startswith("KREX_FAKE_")
        }
        self.native_env = base
        path = os.pathsep.join(
            [str(REPO), str(REPO / "python_client"), base.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
        self.krex_env = dict(base, PYTHONPATH=path)
        self.krex = shlex.split(args.krex) if args.krex else [sys.executable, "-m", "krex_cli"]
        self._warm: bool | None = None

    def argv(self, mode: str, start_ns: int) -> list[str]:
        """The command line of one probe in ``mode``."""
        probe = [self.args.python, PROBE, str(start_ns), self.args.workload]
        if mode == "native":
            return probe
        socket = self.args.mps_socket if mode == "krex-mps" else self.args.socket
        warm = ["--warm"] if mode == "warm" else ["--cold"]
        return [*self.krex, "run", "--socket", socket, *warm, "--", *probe]

    def unavailable(self, mode: str) -> str | None:
        """Why ``mode`` cannot run here, or None."""
        socket = self.args.mps_socket if mode == "krex-mps" else self.args.socket
        if mode != "native" and not socket:
            return "no krexd socket (--socket or KREX_SOCKET)"
        if mode == "warm":
            if self._warm is None:
                self._warm = warm_supported(self.krex, self.krex_env)
            if not self._warm:
                return "krex run does not know --warm"
        return None

    def batch(self, mode: str, n: int) -> dict[str, Any]:
        """Start ``n`` probes at once in ``mode``; their results and failures."""
        why = self.unavailable(mode)
        if why is not None:
            return {"mode": mode, "n": n, "unavailable": why, "results": [], "failures": []}
        env = self.native_env if mode == "native" else self.krex_env
        start = time.monotonic_ns()
        procs = [
            subprocess.Popen(
                self.argv(mode, start),
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        results: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=self.args.timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if p.returncode == 0 and lines:
                results.append(json.loads(lines[-1]))
            else:
                failures.append({"rc": p.returncode, "stderr": err[-1000:]})
        row: dict[str, Any] = {"mode": mode, "n": n, "unavailable": None}
        if (
            mode == "warm"
            and not results
            and all(f["rc"] == 2 and "--warm" in f["stderr"] for f in failures)
        ):
            row["unavailable"] = "krex run rejected --warm"
        return {**row, "results": results, "failures": failures}


def summarize(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (mode, N): p50/p95 per phase over every command of its batches."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for b in batches:
        row = rows.setdefault(
            (b["mode"], b["n"]),
            {
                "mode": b["mode"],
                "n": b["n"],
                "ok": 0,
                "failed": 0,
                "mps": 0,
                "tenants": 0,
                "_ph": [],
            },
        )
        row["unavailable"] = b["unavailable"]
        row["ok"] += len(b["results"])
        row["failed"] += len(b["failures"])
        row["mps"] += sum(bool(r.get("mps")) for r in b["results"])
        row["tenants"] += sum(r.get("tenant") is not None for r in b["results"])
        row["_ph"] += [phases(r) for r in b["results"]]
    for row in rows.values():
        ph = row.pop("_ph")
        for name in PHASES:
            values = [p[name] for p in ph]
            row[name] = {"p50": percentile(values, 50), "p95": percentile(values, 95)}
    return sorted(rows.values(), key=lambda r: (MODES.index(r["mode"]), r["n"]))


def print_table(rows: list[dict[str, Any]]) -> None:
    """The table of :func:`summarize`'s rows (seconds)."""
    head = f"{'mode':9s} {'N':>3s} {'ok':>4s}"
    for name in PHASES:
        head += f" {name + ' p50':>13s} {'p95':>7s}"
    print(head)
    for r in rows:
        line = f"{r['mode']:9s} {r['n']:3d} "
        if r["unavailable"]:
            print(line + f"unavailable: {r['unavailable']}")
            continue
        line += f"{r['ok']:4d}"
        for name in PHASES:
            line += f" {r[name]['p50']:13.3f} {r[name]['p95']:7.3f}"
        if r["failed"]:
            line += f"  ({r['failed']} failed)"
        if r["mode"] != "native" and r["tenants"] < r["ok"]:
            line += f"  (only {r['tenants']} ran as krex tenants)"
        if r["mode"] == "krex-mps" and r["ok"] and r["mps"] < r["ok"]:
            line += f"  (only {r['mps']} ran as MPS clients: is MPS on in that krexd?)"
        print(line)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--counts", type=_counts, default=[1, 12, 32], help="e.g. 1,12,32")
    ap.add_argument("--modes", type=_modes, default=list(MODES), help=",".join(MODES))
    ap.add_argument("--workload", choices=("torch", "fake"), default="torch")
    ap.add_argument("--socket", default=os.environ.get("KREX_SOCKET", ""), help="krexd's socket")
    ap.add_argument("--mps-socket", default="", help="krex-mps mode's krexd (default --socket)")
    ap.add_argument("--krex", default="", help="the krex command (default: python -m krex_cli)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the probes")
    ap.add_argument("--repeats", type=int, default=1, help="batches per mode and N")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between batches")
    ap.add_argument("--timeout", type=float, default=300.0, help="per command, seconds")
    ap.add_argument("--json", default="", help="write the raw results there")
    args = ap.parse_args(argv)
    args.mps_socket = args.mps_socket or args.socket
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every batch (modes interleaved per N), print the table; 1 if a command failed."""
    args = _args(argv)
    bench = Bench(args)
    batches = []
    for n in args.counts:
        for _ in range(args.repeats):
            for mode in args.modes:
                batches.append(bench.batch(mode, n))
                for f in batches[-1]["failures"][:1]:
                    sys.stderr.write(f"{mode} N={n}: a command failed (exit {f['rc']}): ")
                    sys.stderr.write(f"{f['stderr'][-400:]}\n")
                time.sleep(args.pause)
    rows = summarize(batches)
    print_table(rows)
    if args.json:
        out = {"argv": sys.argv, "workload": args.workload, "rows": rows, "batches": batches}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 1 if any(r["failed"] for r in rows if not r["unavailable"]) else 0


if __name__ == "__main__":
    sys.exit(main())
