"""Region entry latency (request → grant), p50/p99, with 1, 7 and 15 busy siblings.

Starts a private krexd, fills one GPU with N busy sibling commands (through
``krex run``, so they are real tenants: confined, gated, drained, frozen), then
runs one holder command that enters and leaves ``region.critical()`` many
times and reports the entry latency krex_client measured for each region.

Siblings (``--sibling``):
  fake   ``fakebench`` over the fake driver, launching 200 µs kernels
         back to back under the shim (default on a machine without a GPU);
  torch  a PyTorch loop of 4096² bf16 matmuls (on a GPU host): ~1.5 ms queued each;
  light  a PyTorch loop of one 4 MiB elementwise op and a synchronize: ~nothing queued;
  spin   a pure CPU loop (no GPU calls at all).

Usage:
  python benchmarks/region_latency.py [--siblings 1,7,15] [--regions 200]
         [--sibling fake|torch|spin] [--fake-gpus 1] [--json OUT]

Prints a table; goal (issue): with 15 siblings p50 ≤ 2 ms, p99 ≤ 10 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KREX = [sys.executable, "-m", "krex_cli"]

_HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from krex_client import region
    n = int(sys.argv[1])
    lat = []
    for _ in range(n):
        with region.critical():
            pass
        st = region.stats()
        lat.append([st["entry_ms"], st["drain_ms"], st["freeze_ms"], st.get("check_ms", 0.0)])
        time.sleep(0.005)
    print(json.dumps(lat))
    """
)

_TORCH_SIBLING = textwrap.dedent(
    """
    import torch
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    while True:
        for _ in range(8):
            b = a @ a
        torch.cuda.synchronize()
    """
)

_LIGHT_SIBLING = textwrap.dedent(
    """
    import torch
    a = torch.randn(1 << 20, device="cuda")
    while True:
        a.mul_(1.0001)
        torch.cuda.synchronize()
    """
)

_SPIN_SIBLING = "while True:\n    pass\n"


def _sibling_argv(kind: str) -> list[str]:
    if kind == "fake":
        bench = os.path.join(REPO, "build", "fakecuda", "bin", "fakebench")
        if not os.path.exists(bench):
            sys.exit(f"{bench} is missing: run `make` first (or use --sibling spin)")
        # KREX_BENCH_KERNEL_NS / KREX_BENCH_SYNC_EVERY set how much work a sibling queues.
        kernel_ns = os.environ.get("KREX_BENCH_KERNEL_NS", "200000")
        sync_every = os.environ.get("KREX_BENCH_SYNC_EVERY", "8")
        return [
            bench,
            "--seconds",
            "3600",
            "--kernel-ns",
            kernel_ns,
            "--link",
            "procaddr",
            "--sync-every",
            sync_every,
        ]
    if kind == "torch":
        return [sys.executable, "-c", _TORCH_SIBLING]
    if kind == "light":
        return [sys.executable, "-c", _LIGHT_SIBLING]
    return [sys.executable, "-c", _SPIN_SIBLING]


def _clean_env() -> dict[str, str]:
    """This script's environment without the ``KREX_*`` of a krexd or tenant it may run under.

    krexd and ``krex run`` take ``KREX_SOCKET`` from the environment before
    any config, so an inherited one would point them at another krexd.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}


def _start_krexd(
    workdir: str, slots: int, fake_gpus: int, driver_lock: str = "auto"
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a private krexd in ``workdir``; returns it and its socket once it answers.

    ``driver_lock``: its ``[region] driver_lock`` ("auto", "require" or "off").

    Raises:
        RuntimeError: krexd exited or did not create its socket within 30 s
            (it is stopped first).
    """
    socket = os.path.join(workdir, "krexd.sock")
    config = os.path.join(workdir, "krex.toml")
    with open(config, "w") as f:
        f.write(
            f'[daemon]\nsocket = "{socket}"\n[admission]\nslots_per_gpu = {slots}\n'
            f'[cgroup]\nname = "krexbench{os.getpid()}"\n[cpu]\nallow_shared = true\n'
            f'[region]\ndriver_lock = "{driver_lock}"\n'
        )
    # --socket as well as the config's: krexd prefers $KREX_SOCKET to its config.
    argv = [sys.executable, "-m", "krexd", "--config", config, "--socket", socket]
    if fake_gpus:
        argv += ["--fake-gpus", str(fake_gpus)]
    with open(os.path.join(workdir, "krexd.log"), "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=_clean_env()
        )
    deadline = time.monotonic() + 30
    while not os.path.exists(socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            with open(os.path.join(workdir, "krexd.log"), errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"krexd did not start; its log ends:\n{tail}")
        time.sleep(0.05)
    return proc, socket


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM ``proc`` (a process this script started), SIGKILL after ``timeout_s``; reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    n_siblings: int, regions: int, kind: str, fake_gpus: int, driver_lock: str = "auto"
) -> dict[str, Any]:
    """One configuration: returns p50/p99 of entry, drain and freeze (ms).

    Whatever it started (krexd, siblings, holder) is stopped before it returns or raises.
    """
    workdir = tempfile.mkdtemp(prefix="krex-bench-")
    siblings: list[subprocess.Popen[bytes]] = []
    krexd: subprocess.Popen[bytes] | None = None
    try:
        krexd, socket = _start_krexd(workdir, n_siblings + 1, fake_gpus, driver_lock)
        env = dict(_clean_env(), KREX_SOCKET=socket)
        for _ in range(n_siblings):
            siblings.append(
                subprocess.Popen(
                    [*KREX, "run", "--cold", "--", *_sibling_argv(kind)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        time.sleep(15.0 if kind in ("torch", "light") else 2.0)  # let siblings get busy
        out = subprocess.run(
            [*KREX, "run", "--cold", "--", sys.executable, "-c", _HOLDER, str(regions)],
            env=env,
            capture_output=True,
            timeout=600,
            check=True,
        )
        lat = json.loads(out.stdout.decode().strip().splitlines()[-1])
        steps = _krexd_steps(socket)
    finally:
        for p in siblings:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in siblings:
            _stop(p)
        if krexd is not None:
            _stop(krexd)
        shutil.rmtree(workdir, ignore_errors=True)
    entry = [x[0] for x in lat]
    drain = [x[1] for x in lat]
    freeze = [x[2] for x in lat]
    check = [x[3] if len(x) > 3 else 0.0 for x in lat]
    return {
        "siblings": n_siblings,
        "sibling": kind,
        "driver_lock": driver_lock,
        "regions": len(lat),
        "entry_p50_ms": _pct(entry, 0.5),
        "entry_p99_ms": _pct(entry, 0.99),
        "drain_p50_ms": _pct(drain, 0.5),
        "freeze_p50_ms": _pct(freeze, 0.5),
        "freeze_p99_ms": _pct(freeze, 0.99),
        "check_p50_ms": _pct(check, 0.5),
        "krexd_steps_p50_ms": steps,
    }


def _krexd_steps(socket: str) -> dict[str, float]:
    """krexd's own p50 (ms) of each establishment step and of the state save (status)."""
    sys.path.insert(0, os.path.join(REPO, "python_client"))
    from krex_client.connection import Connection

    st = Connection(socket, timeout_s=10).request("status")
    region = st["gpus"][0].get("region") or {}
    out = {k: float(v["p50"]) for k, v in (region.get("steps_ms") or {}).items()}
    save = (st.get("server") or {}).get("state_save_ms")
    if save:
        out["save"] = float(save["p50"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--siblings", default="1,7,15")
    ap.add_argument("--regions", type=int, default=200)
    ap.add_argument("--sibling", choices=("fake", "torch", "light", "spin"), default="fake")
    ap.add_argument("--fake-gpus", type=int, default=1, help="0 on a host with a real GPU")
    ap.add_argument(
        "--driver-lock",
        choices=("auto", "require", "off"),
        default="auto",
        help="krexd's [region] driver_lock (off: the shim's acknowledgements alone)",
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    try:
        rows = [
            run(int(n), args.regions, args.sibling, args.fake_gpus, args.driver_lock)
            for n in args.siblings.split(",")
        ]
    except RuntimeError as exc:
        sys.exit(f"region_latency: {exc}")
    except subprocess.CalledProcessError as exc:
        sys.exit(f"region_latency: the holder failed ({exc}):\n{exc.stderr.decode()[-2000:]}")
    print(
        f"{'siblings':>8} {'kind':>6} {'n':>5} {'entry p50':>10} {'entry p99':>10} "
        f"{'drain p50':>10} {'freeze p50':>10} {'freeze p99':>10} {'check p50':>10}  (ms)"
    )
    for r in rows:
        print(
            f"{r['siblings']:>8} {r['sibling']:>6} {r['regions']:>5} {r['entry_p50_ms']:>10.3f} "
            f"{r['entry_p99_ms']:>10.3f} {r['drain_p50_ms']:>10.3f} {r['freeze_p50_ms']:>10.3f} "
            f"{r['freeze_p99_ms']:>10.3f} {r['check_p50_ms']:>10.3f}"
        )
    names = list(rows[0]["krexd_steps_p50_ms"]) if rows else []
    print("krexd's p50 of each step (ms; 'save': the state save before the grant's reply):")
    print(f"{'siblings':>8} " + " ".join(f"{n:>7}" for n in names))
    for r in rows:
        steps = r["krexd_steps_p50_ms"]
        print(f"{r['siblings']:>8} " + " ".join(f"{steps.get(n, 0.0):>7.3f}" for n in names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
