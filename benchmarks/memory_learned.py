"""Learned memory needs on one H200: the corpus plus memory-heavy tasks, no ``--mem`` anywhere.

    sudo python benchmarks/memory_learned.py run --out DIR [--concurrency 12 16]
                                                 [--corpus workloads/trace.jsonl]
    python benchmarks/memory_learned.py trace --out TRACE     # only write the trace

The trace is the project's corpus (``workloads/trace.jsonl``) with one
memory-heavy task inserted after every ``--every`` (6) commands: this
script's ``heavy`` worker, which holds 40 to 60 GiB through PyTorch
(inputs, then a compile/autotune workspace left in PyTorch's cache, like the
scaled-dot-product-attention problems of issue 15), then times a GEMM with
``krex_client.do_bench`` inside a critical region.  No command declares its
memory.

For each concurrency, two modes, each with a fresh krexd state directory:

* ``admission-off``: ``[memory] admission = false, learn = false`` (the
  shim still waits up to ``oom_wait_s`` for co-tenants' memory);
* ``learned``: admission by memory with learned needs (the default config).

Each mode replays the trace twice through ``krex replay --mode krex --warm
off`` (cold starts): a warm-up pass (compile caches; in ``learned`` every
label runs once and is learned) and the measured pass, in the same state
directory.  The replay retries a command that exits 75 (at most twice,
``retries`` in its record); every such exit is a command failed by
co-tenants.  Printed per mode:
commands, ok, failed by co-tenants (exits 75, retried or final), other
failures, makespan (s) and throughput (ok commands per minute).  Also
written to ``DIR/summary.json``.  Needs root (krexd makes cgroups).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
HEAVY_GIB = (40, 48, 56, 60, 44, 52)
MODES: dict[str, dict[str, Any]] = {
    "admission-off": {"admission": False, "learn": False},
    "learned": {"admission": True, "learn": True},
}


def heavy(args: argparse.Namespace) -> int:
    """The memory-heavy worker: hold ``--gib`` GiB, time a GEMM in a region; one JSON line."""
    import torch

    from krex_client import do_bench

    t0 = time.monotonic()
    try:
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        inputs = int(args.gib * 0.6 * GIB)
        data = [torch.ones(GIB, dtype=torch.uint8, device="cuda") for _ in range(inputs // GIB)]
        ws = torch.empty(int(args.gib * GIB) - inputs, dtype=torch.uint8, device="cuda")
        ws.fill_(0)
        del ws  # stays in PyTorch's cache, as autotuning buffers do
        time.sleep(args.hold)
        ms = do_bench(lambda: a @ b, warmup_ms=25, rep_ms=100)
        peak = torch.cuda.max_memory_reserved() / GIB
        del data
    except torch.OutOfMemoryError as exc:
        print(f"heavy {args.gib} GiB: torch.OutOfMemoryError: {exc}", file=sys.stderr)
        return 1
    res: dict[str, Any] = {"family": "heavy", "task": f"heavy_{args.gib}g", "candidate": "torch"}
    res |= {"median_ms": ms, "mean_ms": ms, "min_ms": ms, "reps": 1, "peak_gib": round(peak, 1)}
    print(json.dumps(res | {"run_s": round(time.monotonic() - t0, 2)}), flush=True)
    return 0


def make_trace(corpus: Path, out: Path, every: int) -> int:
    """The corpus with a heavy task after every ``every`` commands; returns the count."""
    lines = [ln for ln in corpus.read_text().splitlines() if ln.strip()]
    out_lines: list[str] = []
    for i, line in enumerate(lines, 1):
        out_lines.append(line)
        if i % every == 0:
            gib = HEAVY_GIB[(i // every) % len(HEAVY_GIB)]
            argv = ["python", "benchmarks/memory_learned.py", "heavy", "--gib", str(gib)]
            entry = {"argv": argv, "task": f"heavy_{gib}g", "candidate": "torch"}
            out_lines.append(json.dumps(entry | {"band": "1-10ms", "family": "heavy"}))
    out.write_text("\n".join(out_lines) + "\n")
    return len(out_lines)


def _config(out: Path, memory: dict[str, Any]) -> Path:
    """etc/krex.toml with ``memory`` set and a fresh state directory under ``out``."""
    sys.path.insert(0, str(REPO))
    from krex_cli.replay.modes import dumps_toml

    with open(REPO / "etc" / "krex.toml", "rb") as f:
        cfg = tomllib.load(f)
    state = out / "state"
    state.mkdir(parents=True, exist_ok=True)
    cfg.setdefault("daemon", {})["state_dir"] = str(state)
    # Each replay's krexd has a cgroup name of its own: one learned-needs file for the
    # mode's warm-up and measured passes, as one long-running krexd would keep.
    cfg.setdefault("memory", {}).update(memory, learned_file=str(state / "learned-memory.json"))
    path = out / "krex.toml"
    path.write_text(dumps_toml(cfg))
    return path


def _replay(trace: Path, conc: int, config: Path, out: Path) -> None:
    cmd = [sys.executable, "-m", "krex_cli", "replay", str(trace), "--mode", "krex"]
    cmd += ["--concurrency", str(conc), "--config", str(config), "--repeat", "1"]
    cmd += ["--no-progress", "--no-report", "--out", str(out)]
    cmd += ["--warm", "off"]  # cold starts, as docs/bench/memory-learned-h200.md measured
    path = os.pathsep.join(
        x for x in (str(REPO), str(REPO / "python_client"), os.environ.get("PYTHONPATH")) if x
    )
    env = dict(os.environ, PYTHONPATH=path)
    with open(f"{out}.log", "w") as log:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)


def _summary(run_dir: Path) -> dict[str, Any]:
    recs = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines() if x]
    ok = [r for r in recs if r.get("exit_code") == 0]
    cotenant = sum(int(r.get("retries") or 0) + (r.get("exit_code") == 75) for r in recs)
    makespan = max(r["end"] for r in recs) - min(r["start"] for r in recs) if recs else 0.0
    return {
        "commands": len(recs),
        "ok": len(ok),
        "cotenant_failures": cotenant,
        "other_failures": sum(1 for r in recs if r.get("exit_code") not in (0, 75)),
        "makespan_s": round(makespan, 1),
        "ok_per_min": round(60 * len(ok) / makespan, 2) if makespan else 0.0,
    }


def run(args: argparse.Namespace) -> int:
    """Both modes at every concurrency; prints a table, writes summary.json."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.jsonl"
    n = make_trace(Path(args.corpus), trace, args.every)
    print(f"trace: {n} commands ({trace})", flush=True)
    rows: dict[str, Any] = {}
    for conc in args.concurrency:
        for mode, memory in MODES.items():
            d = out / f"c{conc}-{mode}"
            config = _config(d, memory)
            _replay(trace, conc, config, d / "warmup")  # compile caches; labels learned
            _replay(trace, conc, config, d / "measured")
            rows[f"c{conc} {mode}"] = s = _summary(d / "measured")
            print(f"c{conc} {mode}: {json.dumps(s)}", flush=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| run | commands | ok | failed by co-tenants | other failures | makespan s | ok/min |")
    print("|---|---|---|---|---|---|---|")
    for name, s in rows.items():
        print(
            f"| {name} | {s['commands']} | {s['ok']} | {s['cotenant_failures']} | "
            f"{s['other_failures']} | {s['makespan_s']} | {s['ok_per_min']} |"
        )
    return 0


def main() -> int:
    """``run``, ``trace`` or ``heavy`` (the worker the trace runs)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--concurrency", type=int, nargs="+", default=[12, 16])
    r.add_argument("--corpus", default=str(REPO / "workloads" / "trace.jsonl"))
    r.add_argument("--every", type=int, default=6, help="a heavy task after every N commands")
    t = sub.add_parser("trace")
    t.add_argument("--out", required=True)
    t.add_argument("--corpus", default=str(REPO / "workloads" / "trace.jsonl"))
    t.add_argument("--every", type=int, default=6)
    h = sub.add_parser("heavy")
    h.add_argument("--gib", type=int, required=True)
    h.add_argument("--hold", type=float, default=4.0, help="seconds the memory is held first")
    args = ap.parse_args()
    if args.cmd == "heavy":
        return heavy(args)
    if args.cmd == "trace":
        print(make_trace(Path(args.corpus), Path(args.out), args.every))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
