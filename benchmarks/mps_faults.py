"""GPU-wide faults under MPS on a real GPU (issue 18; docs/design/faults.md).

Run as root on a GPU host, from the repository root (MPS on needs
``nvidia-cuda-mps-control``)::

    python3 benchmarks/mps_faults.py --out /tmp/mps-faults

1. Scenario, MPS on then off: four tenants run bf16 GEMMs for ``--seconds``
   (25) and a fifth writes to address 0x10 after ``--delay`` (8) s, all
   through ``krex run`` at slots ``--slots`` (12) on GPU 0.  Expected with
   MPS on: the faulty one exits 1 with its own error, the four others exit
   0 (after one re-run each), krexd's status counts one incident.
2. Replay (``--replay-seconds`` > 0, default 300): ``workloads/trace-h200.jsonl``
   with one faulty entry (``fault_tenant.py fault 2``) every ``--every``
   (25) entries, ``krex replay --mode krex --warm off`` (cold starts) with MPS on and off, then the
   report: 0 casualties lost, throughput on against off.

Prints one table per part; keeps each krexd's log and the MPS server logs
under ``--out`` (the lines docs/design/faults.md assumes can be checked there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "python_client"), str(REPO / "benchmarks")]

from region_latency import KREX, _clean_env, _stop  # noqa: E402

from krex_client.connection import Connection  # noqa: E402

TENANT = str(REPO / "workloads" / "fault_tenant.py")


def _config(workdir: Path, slots: int, mps: bool) -> Path:
    socket = workdir / "krexd.sock"
    path = workdir / "krex.toml"
    path.write_text(
        f'[daemon]\nsocket = "{socket}"\nstate_dir = "{workdir}"\n'
        f"[admission]\nslots_per_gpu = {slots}\n"
        f'[cgroup]\nname = "krexfault{os.getpid()}"\n[cpu]\nallow_shared = true\n'
        f"[mps]\nenabled = {'true' if mps else 'false'}\n"
    )
    return path


def _start(workdir: Path, config: Path) -> tuple[subprocess.Popen[bytes], str]:
    socket = str(workdir / "krexd.sock")
    with open(workdir / "krexd.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "krexd", "--config", str(config), "--socket", socket],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=_clean_env(),
        )
    deadline = time.monotonic() + 60
    while not os.path.exists(socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"krexd did not start; see {workdir}/krexd.log")
        time.sleep(0.1)
    return proc, socket


def _scenario(out: Path, mps: bool, args: argparse.Namespace) -> dict[str, Any]:
    workdir = out / f"scenario-mps-{'on' if mps else 'off'}"
    workdir.mkdir(parents=True, exist_ok=True)
    proc, socket = _start(workdir, _config(workdir, args.slots, mps))
    env = dict(_clean_env(), KREX_SOCKET=socket)
    try:

        def run(*cmd: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [*KREX, "run", "--gpu", "0", "--", sys.executable, TENANT, *cmd],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

        healthy = [run("gemm", str(args.seconds)) for _ in range(4)]
        faulty = run("fault", str(args.delay))
        ends = [(p, *p.communicate(timeout=1800)) for p in [faulty, *healthy]]
        with Connection(socket, timeout_s=10) as conn:
            faults = conn.request("status").get("faults")
    finally:
        _stop(proc)
    rows = []
    for i, (p, o, e) in enumerate(ends):
        (workdir / f"tenant{i}.err").write_text(e)
        res = next((json.loads(x) for x in o.splitlines() if x.startswith("{")), {})
        rows.append(
            {
                "who": "faulty" if i == 0 else f"healthy{i}",
                "exit": p.returncode,
                "matmuls": res.get("matmuls"),
                "reruns": e.count("running it"),
                "own_error_line": "its own kernel faulted" in e,
            }
        )
    return {"mps": mps, "tenants": rows, "faults": faults}


def _replay(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    trace = out / "trace-faulty.jsonl"
    lines = [x for x in (REPO / "workloads" / "trace-h200.jsonl").read_text().splitlines() if x]
    fault = json.dumps(
        {"argv": ["python", TENANT, "fault", "2"], "task": "fault", "candidate": "oob_write"}
    )
    mixed: list[str] = []
    for i, x in enumerate(lines):
        mixed.append(x)
        if (i + 1) % args.every == 0:
            mixed.append(fault)
    trace.write_text("\n".join(mixed) + "\n")
    runs = {}
    for mps in (False, True):
        name = f"replay-mps-{'on' if mps else 'off'}"
        d = out / name
        shutil.rmtree(d, ignore_errors=True)
        cfg = out / f"{name}.toml"
        cfg.write_text(
            (REPO / "etc" / "krex.toml")
            .read_text()
            .replace("enabled = false", f"enabled = {'true' if mps else 'false'}")
        )
        subprocess.run(
            [*KREX, "replay", str(trace), "--mode", "krex", "--concurrency", str(args.slots)]
            + ["--config", str(cfg), "--duration", str(args.replay_seconds)]
            + ["--warm", "off"]  # cold starts, as measured before krex run started warm
            + ["--no-progress", "--no-report", "--out", str(d)],
            check=False,
            cwd=REPO,
        )
        runs[name] = d
    report = out / "replay-report"
    subprocess.run([*KREX, "replay", "report", *map(str, runs.values()), "--out", str(report)])
    metrics = json.loads((report / "metrics.json").read_text())
    return {
        k: {
            "throughput": v["throughput_cmds_per_min"],
            "completed": v["completed"],
            "failed": v["failed"],
            **v.get("gpu_faults", {}),
        }
        for k, v in metrics["runs"].items()
    }


def main() -> int:
    """Run both parts and print their tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--slots", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--delay", type=float, default=8.0)
    ap.add_argument("--replay-seconds", type=int, default=300)
    ap.add_argument("--every", type=int, default=25)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"scenario": [_scenario(args.out, m, args) for m in (True, False)]}
    print("| MPS | tenant | exit | matmuls | re-runs | own-error line |\n|---|---|---|---|---|---|")
    for s in result["scenario"]:
        for r in s["tenants"]:
            print(
                f"| {'on' if s['mps'] else 'off'} | {r['who']} | {r['exit']} | {r['matmuls']} "
                f"| {r['reruns']} | {r['own_error_line']} |"
            )
    if args.replay_seconds > 0:
        result["replay"] = _replay(args.out, args)
        print("\n| run | cmds/min | completed | failed | culprits | casualties | re-runs | lost |")
        print("|---|---|---|---|---|---|---|---|")
        for k, v in result["replay"].items():
            print(
                f"| {k} | {v['throughput']:.1f} | {v['completed']} | {v['failed']} | "
                f"{v.get('culprits')} | {v.get('casualties')} | {v.get('reruns')} | "
                f"{v.get('casualties_lost')} |"
            )
    (args.out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
