"""Memory admission on one GPU: co-tenant OOM failures and throughput, with and without it.

    sudo python benchmarks/memory_admission.py [--out DIR] [--commands 48] [--concurrency 12]
    sudo python benchmarks/memory_admission.py --fake --commands 16   # no GPU: fake driver

The same mixed workload runs twice through a private krexd (``--gpu 0``,
``slots_per_gpu = concurrency``):

* ``unprotected``: ``[memory] admission = false``, ``oom_wait_s = 0``: commands
  are admitted by slots alone and an allocation that meets co-tenants'
  memory fails at once (what the H200 measurement saw);
* ``protected``: admission by memory (each command declares its need with
  ``krex run --mem``) and co-tenant out-of-memory waits (``oom_wait_s = 30``).

Each command is this script's ``worker``: PyTorch allocates the inputs of a
problem (bf16 GEMM operands plus a data tensor) and a compile/autotune
workspace that stays in PyTorch's cache, holds them while "compiling"
(sleep), then times a GEMM with ``krex_client.do_bench`` inside a critical
region.  Sizes come in four classes (4 to 40 GiB), mixed in one fixed
order, so twelve at a time ask for more than an H200's 141 GB on average.
A worker exits 1 on ``torch.OutOfMemoryError`` like a benchmark would;
``krex run`` turns that into 75 when co-tenants caused it.

Per mode: commands ok / failed with exit 75 (co-tenant OOM) / failed at
region entry because the shim's L2 flush buffer met a full GPU / own OOM /
other failures, makespan, throughput (ok commands per minute), mean wait for
admission, peak GPU memory and tenants seen by krexd, OOM waits absorbed.
Writes ``memory_admission.json`` and ``memory_admission.md`` (a short table)
to ``--out``.  Budget: no command starts after ``--mode-budget-s`` (100 s)
of a mode, and one started then gets at most 15 s more, so both modes end
within 4 minutes on one H200 (commands not started are counted "skipped").
Needs root (krexd makes cgroups); ``--fake`` runs the same orchestration on
the fake driver (tests/fakecuda, ``make``), sizes scaled by ``--fake-scale``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
# (class, inputs GiB, workspace GiB, how many of 48): mean peak ~15 GiB per command.
CLASSES = [("small", 2, 2, 18), ("medium", 6, 6, 14), ("large", 14, 10, 10), ("xl", 24, 16, 6)]
CONTEXT_GIB = 1  # CUDA context, cuBLAS workspace: added to the declared need
HOLD_S = 3.0  # "compile" time with the memory held
MODES: dict[str, dict[str, Any]] = {
    "unprotected": {"admission": False, "oom_wait_s": 0.0},
    "protected": {"admission": True, "oom_wait_s": 30.0, "headroom": "2G", "max_bypass": 4},
}


# --- worker (one benchmarking command) --------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    """Allocate inputs and a workspace, hold them, time a GEMM in a region; JSON on stdout."""
    t0 = time.monotonic()
    if args.backend == "fake":
        return _fake_worker(args, t0)
    import torch

    from krex_client import do_bench

    try:
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        rest = max(0, int(args.inputs_gib * GIB) - 2 * a.numel() * a.element_size())
        data = torch.empty(rest, dtype=torch.uint8, device="cuda").fill_(1)
        ws = torch.empty(int(args.workspace_gib * GIB), dtype=torch.uint8, device="cuda")
        ws.fill_(0)
        del ws  # stays in PyTorch's cache, as autotuning buffers do
        time.sleep(args.hold_s)
        ms = do_bench(lambda: a @ b, warmup_ms=25, rep_ms=100)
        peak = torch.cuda.max_memory_reserved() / GIB
        del data
    except torch.OutOfMemoryError as exc:
        print(f"worker {args.name}: torch.OutOfMemoryError: {exc}", file=sys.stderr)
        return 1
    assert isinstance(ms, float)
    _report(args, t0, ms, peak)
    return 0


def _fake_worker(args: argparse.Namespace, t0: float) -> int:
    sys.path.insert(0, str(REPO))
    from krex_client import region
    from tests.fakecuda import fakegpu

    gpu = fakegpu.init()
    try:
        held = [gpu.alloc(int(args.inputs_gib * GIB)), gpu.alloc(int(args.workspace_gib * GIB))]
    except fakegpu.CudaError as exc:
        print(f"worker {args.name}: {exc}", file=sys.stderr)
        return 1
    time.sleep(args.hold_s)
    with region.critical():
        start = time.monotonic()
        gpu.launch(2_000_000)
        gpu.synchronize()
        ms = (time.monotonic() - start) * 1e3
    _report(args, t0, ms, (args.inputs_gib + args.workspace_gib))
    for p in held:
        gpu.free(p)
    return 0


def _report(args: argparse.Namespace, t0: float, ms: float, peak_gib: float) -> None:
    print(
        json.dumps(
            {
                "name": args.name,
                "ms": round(ms, 4),
                "admit_ms": float(os.environ.get("KREX_ADMIT_MS", "0")),
                "peak_gib": round(peak_gib, 2),
                "run_s": round(time.monotonic() - t0, 2),
            }
        ),
        flush=True,
    )


# --- one mode: a private krexd, the workload through krex run ------------------------------


def workload(n: int, seed: int, scale: float) -> list[dict[str, Any]]:
    """``n`` commands in one fixed shuffled order (same for every mode)."""
    per = sum(c[3] for c in CLASSES)
    cmds = []
    for name, inputs, ws, count in CLASSES:
        for i in range(round(count * n / per)):
            need = (inputs + ws + CONTEXT_GIB) * scale
            cmds.append(
                {
                    "name": f"{name}{i}",
                    "inputs_gib": inputs * scale,
                    "workspace_gib": ws * scale,
                    "mem": f"{int(need * 1024)}M",
                }
            )
    random.Random(seed).shuffle(cmds)
    return cmds


def _toml(tables: dict[str, dict[str, Any]]) -> str:
    out = []
    for table, keys in tables.items():
        out.append(f"[{table}]")
        out += [
            f"{k} = {json.dumps(v) if isinstance(v, str) else str(v).lower()}"
            for k, v in keys.items()
        ]
    return "\n".join(out) + "\n"


class Daemon:
    """A private krexd for one mode (started as root; stopped with SIGTERM)."""

    def __init__(self, workdir: Path, mode: str, slots: int, fake: bool, env: dict[str, str]):
        self.socket = str(workdir / "krexd.sock")
        cfg = workdir / "krex.toml"
        cfg.write_text(
            _toml(
                {
                    "daemon": {"socket": self.socket, "log_level": "info"},
                    "admission": {"slots_per_gpu": slots},
                    "cgroup": {"name": f"krexmem{os.getpid()}{mode}"},
                    "cpu": {"allow_shared": True},
                    "memory": {"refresh_ms": 100, **MODES[mode]},
                }
            )
        )
        self.log = workdir / "krexd.log"
        argv = [sys.executable, "-m", "krexd", "--foreground", "--config", str(cfg)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv + (["--fake-gpus", "1"] if fake else []),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
        from krex_client.connection import Connection, KrexUnavailable

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with Connection(self.socket, timeout_s=1.0) as c:
                    c.request("ping")
                return
            except KrexUnavailable:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise SystemExit(f"krexd did not start:\n{self.log.read_text()[-3000:]}")

    def status(self) -> dict[str, Any]:
        from krex_client.connection import Connection

        with Connection(self.socket, timeout_s=5.0) as c:
            return dict(c.request("status"))

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        return self.log.read_text(errors="replace")


def run_mode(
    mode: str, cmds: list[dict[str, Any]], args: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """Run ``cmds`` at ``args.concurrency`` through a private krexd in ``mode``."""
    with tempfile.TemporaryDirectory(prefix=f"krexmem-{mode}-") as tmp:
        d = Daemon(Path(tmp), mode, args.concurrency, args.fake, env)
        status = d.status()
        peaks = {"used_gib": 0.0, "tenants": 0, "waiting": 0}
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.25):
                try:
                    g = d.status()["gpus"][0]
                except Exception:
                    continue
                mem = g.get("memory") or {}
                peaks["used_gib"] = max(peaks["used_gib"], (mem.get("used_bytes") or 0) / GIB)
                peaks["tenants"] = max(peaks["tenants"], len(g.get("tenants", [])))
                peaks["waiting"] = max(peaks["waiting"], len(mem.get("waiting") or []))

        deadline = time.monotonic() + args.mode_budget_s

        def one(c: dict[str, Any]) -> dict[str, Any]:
            left = deadline - time.monotonic()
            if left <= 0:  # the mode's budget is spent: not started
                return {
                    **c,
                    "exit": None,
                    "wall_s": 0.0,
                    "result": None,
                    "outcome": "skipped",
                    "stderr_tail": "",
                }
            limit = min(args.command_timeout_s, left + 15)
            argv = [
                sys.executable,
                "-m",
                "krex_cli",
                "run",
                "--gpu",
                "0",
                "--mem",
                c["mem"],
                "--timeout",
                f"{limit:.0f}",
                "--",
                sys.executable,
                __file__,
                "worker",
                "--name",
                c["name"],
                "--inputs-gib",
                str(c["inputs_gib"]),
                "--workspace-gib",
                str(c["workspace_gib"]),
                "--hold-s",
                str(args.hold_s),
                "--backend",
                "fake" if args.fake else "torch",
            ]
            t = time.monotonic()
            p = subprocess.run(
                argv, env=dict(env, KREX_SOCKET=d.socket), capture_output=True, text=True, cwd=REPO
            )
            out = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
            return {
                **c,
                "exit": p.returncode,
                "wall_s": round(time.monotonic() - t, 2),
                "result": out[-1] if out else None,
                "outcome": _classify(p),
                "stderr_tail": p.stderr[-600:] if p.returncode else "",
            }

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, cmds))
        makespan = time.monotonic() - t0
        done.set()
        log = d.stop()
    return {
        "mode": mode,
        "settings": MODES[mode],
        "gpu": status["gpus"][0]["name"],
        "memory_source": (status.get("memory") or {}).get("source"),
        "summary": _summary(results, makespan, peaks, log),
        "commands": results,
    }


def _classify(p: subprocess.CompletedProcess[str]) -> str:
    if p.returncode == 0:
        return "ok"
    if p.returncode == 75:
        return "cotenant_oom"
    if "L2 flush at region entry failed (CUresult 2)" in p.stderr:
        return "region_l2_oom"  # the shim's L2 buffer, allocated in the region, met a full GPU
    if re.search(r"OutOfMemoryError|OUT_OF_MEMORY|out of memory", p.stderr):
        return "own_oom"
    return "other"


def _summary(
    results: list[dict[str, Any]], makespan: float, peaks: dict[str, Any], log: str
) -> dict[str, Any]:
    def count(o: str) -> int:
        return sum(1 for r in results if r["outcome"] == o)

    admits = [r["result"]["admit_ms"] / 1e3 for r in results if r["result"]]
    return {
        "commands": len(results),
        "ok": count("ok"),
        "cotenant_oom": count("cotenant_oom"),
        "own_oom": count("own_oom"),
        "region_l2_oom": count("region_l2_oom"),
        "other": count("other"),
        "skipped": count("skipped"),
        "makespan_s": round(makespan, 1),
        "throughput_per_min": round(count("ok") / makespan * 60, 2),
        "mean_admit_wait_s": round(sum(admits) / len(admits), 2) if admits else None,
        "peak_used_gib": round(peaks["used_gib"], 1),
        "peak_tenants": peaks["tenants"],
        "peak_oom_waiting": peaks["waiting"],
        "oom_waits_absorbed": len(re.findall(r"memory: need .*, waited$", log, re.M)),
    }


def table(report: dict[str, Any]) -> str:
    """The short markdown table of the two modes."""
    rows = [
        "| mode | ok | co-tenant OOM (exit 75) | L2-flush OOM in region | own OOM | other/not run "
        "| makespan s | ok/min | mean admit wait s | peak GiB | peak tenants "
        "| OOM waits absorbed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in report["modes"]:
        s = m["summary"]
        rows.append(
            f"| {m['mode']} | {s['ok']}/{s['commands']} | {s['cotenant_oom']} | "
            f"{s['region_l2_oom']} | {s['own_oom']} | {s['other']}/{s['skipped']} | "
            f"{s['makespan_s']} | "
            f"{s['throughput_per_min']} | {s['mean_admit_wait_s']} | "
            f"{s['peak_used_gib']} | {s['peak_tenants']} | {s['oom_waits_absorbed']} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: ``worker`` (one command) or the benchmark (both modes)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--name", required=True)
    w.add_argument("--inputs-gib", type=float, required=True)
    w.add_argument("--workspace-gib", type=float, required=True)
    w.add_argument("--hold-s", type=float, default=HOLD_S)
    w.add_argument("--backend", choices=("torch", "fake"), default="torch")
    p.add_argument("--out", default="out/memory_admission")
    p.add_argument("--commands", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--modes", default="unprotected,protected")
    p.add_argument("--hold-s", type=float, default=HOLD_S)
    p.add_argument("--command-timeout-s", type=float, default=90.0)
    p.add_argument(
        "--mode-budget-s",
        type=float,
        default=100.0,
        help="no command starts after this many seconds of a mode (4 min for both in all)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fake", action="store_true", help="fake driver instead of a GPU")
    p.add_argument("--fake-scale", type=float, default=1 / 16, help="sizes x this with --fake")
    args = p.parse_args(argv)
    if args.cmd == "worker":
        return worker(args)
    if os.geteuid() != 0:
        raise SystemExit("memory_admission.py needs root (krexd makes cgroups)")
    scale = args.fake_scale if args.fake else 1.0
    path = [str(REPO), str(REPO / "python_client")]
    if os.environ.get("PYTHONPATH"):  # keep what the caller added (e.g. packages not installed)
        path.append(os.environ["PYTHONPATH"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    if args.fake:
        state = tempfile.mkdtemp(prefix="krexmem-fake-")
        env.update(
            LD_LIBRARY_PATH=str(REPO / "build" / "fakecuda"),
            KREX_FAKE_STATE=os.path.join(state, "state"),
            KREX_FAKE_MEM_BYTES=f"{int(140 * 1024 * scale)}M",
        )
    cmds = workload(args.commands, args.seed, scale)
    report = {
        "commands": cmds,
        "concurrency": args.concurrency,
        "hold_s": args.hold_s,
        "mode_budget_s": args.mode_budget_s,
        "modes": [run_mode(m, cmds, args, env) for m in args.modes.split(",")],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory_admission.json").write_text(json.dumps(report, indent=2))
    (out / "memory_admission.md").write_text(table(report))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
