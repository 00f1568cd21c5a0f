"""Another user's ``status`` flood vs region entry: p50/p99 of a holder's entry latency.

Starts a private krexd (socket open to every uid), then, for each mode, runs
one holder command as root that enters and leaves ``region.critical()``
``--regions`` times while

  quiet  nothing else talks to krexd;
  flood  uid 65534 keeps ``--sockets`` ``status`` requests outstanding at
         once (a DEALER socket each, resending at every reply), through
         ``tests.daemon.asuser`` (run as root: it drops the uid itself);
         ``--flood connections``: new connections, one ping each, closed;
         ``--flood admits``: admits kept outstanding, never placed;
         ``--flood pool-threads``: ``--pools`` warm pools of ``--sockets``
         threads each registered (every region freezes the pools), with
         krexd's ``[warm] pids_max`` from ``--pool-pids-max``.

Reports entry p50/p99 (ms, as krex_client measures: request to grant) and
the flood's replies and ``TOO_MANY`` refusals per second.

Usage:
  python benchmarks/status_flood.py [--regions 300] [--sockets 32] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from region_latency import _HOLDER, KREX, REPO, _clean_env, _pct, _stop  # noqa: E402

_FLOOD = """
import msgpack, zmq
ctx = zmq.Context()
n, secs = int(sys.argv[-2]), float(sys.argv[-1])
frame = msgpack.packb({"v": 1, "id": 1, "op": "status", "body": {}})
socks = []
for _ in range(n):
    s = ctx.socket(zmq.DEALER)
    s.connect("ipc://" + os.environ["KREX_SOCKET"])
    s.send(frame)
    socks.append(s)
poller = zmq.Poller()
for s in socks:
    poller.register(s, zmq.POLLIN)
ok = refused = 0
end = time.monotonic() + secs
while time.monotonic() < end:
    for s, _ in poller.poll(100):
        r = msgpack.unpackb(s.recv())
        if r["ok"]:
            ok += 1
        else:
            refused += 1
        s.send(frame)
print(json.dumps({"ok": ok, "refused": refused, "s": secs}), flush=True)
"""


_CHURN = """
import msgpack, zmq
ctx = zmq.Context()
n, secs = int(sys.argv[-2]), float(sys.argv[-1])
frame = msgpack.packb({"v": 1, "id": 1, "op": "ping", "body": {}})
ok = refused = 0
end = time.monotonic() + secs
while time.monotonic() < end:
    socks = []
    for _ in range(n):  # n new connections, one ping each, then all closed
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect("ipc://" + os.environ["KREX_SOCKET"])
        s.send(frame)
        socks.append(s)
    for s in socks:
        if s.poll(1000):
            r = msgpack.unpackb(s.recv())
            ok += 1 if r["ok"] else 0
            refused += 0 if r["ok"] else 1
        s.close()
print(json.dumps({"ok": ok, "refused": refused, "s": secs}), flush=True)
"""

_ADMITS = """
import msgpack, zmq
ctx = zmq.Context()
n, secs = int(sys.argv[-2]), float(sys.argv[-1])
s = ctx.socket(zmq.DEALER)
s.connect("ipc://" + os.environ["KREX_SOCKET"])
def send(i):  # an admit it never places: granted ones squat until place_timeout_s
    body = {"argv": ["sleep", "60"], "exclusive": False}
    s.send(msgpack.packb({"v": 1, "id": i, "op": "admit", "body": body}))
for i in range(n):
    send(i)
ok = refused = 0
i = n
end = time.monotonic() + secs
while time.monotonic() < end:
    if s.poll(100):
        r = msgpack.unpackb(s.recv())
        ok += 1 if r["ok"] else 0
        refused += 0 if r["ok"] else 1
        send(i)
        i += 1
print(json.dumps({"ok": ok, "refused": refused, "s": secs}), flush=True)
"""

_POOL_THREADS = """
import msgpack, threading, zmq
n, secs = int(sys.argv[-2]), float(sys.argv[-1])
pools = int(os.environ.get("FLOOD_POOLS", "1"))
s = zmq.Context().socket(zmq.DEALER)
s.connect("ipc://" + os.environ["KREX_SOCKET"])
def req(op, body):
    s.send(msgpack.packb({"v": 1, "id": 1, "op": op, "body": body}))
    return msgpack.unpackb(s.recv())
version = req("ping", {})["body"]["version"]
out = []
for i in range(pools):
    r, w = os.pipe()
    kid = os.fork()  # a zygote: a direct child, as a keeper's is
    if kid == 0:
        stop = threading.Event()
        made = 0
        for _ in range(n):
            try:
                threading.Thread(target=stop.wait, daemon=True).start()
            except RuntimeError:
                break
            made += 1
        os.write(w, str(made).encode() + b"\\n")
        time.sleep(secs)
        os._exit(0)
    made = int(os.fdopen(r).readline())
    body = {"pid": kid, "key": f"flood{i}", "version": version, "interpreter": "/bin/sleep",
            "modules": []}
    got = req("pool_register", body)
    out.append({"threads": made, "registered": got["ok"], "error": got.get("error")})
print(json.dumps(out if pools > 1 else out[0]), flush=True)
time.sleep(secs)
"""

_KREXCTL = "import sys; from krex_cli.krexctl import main; sys.exit(main())"


def _start_krexd(
    workdir: str,
    per_s: float | None = None,
    conn_per_s: float | None = None,
    pool_pids_max: int | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """A private krexd with one fake GPU whose socket every uid may open;
    ``per_s``: its ``[daemon] status_per_s_per_uid``, ``conn_per_s`` its
    ``connections_per_s_per_uid``, ``pool_pids_max`` its ``[warm] pids_max``
    (None: the default)."""
    socket = os.path.join(workdir, "krexd.sock")
    config = os.path.join(workdir, "krex.toml")
    with open(config, "w") as f:
        f.write(
            f'[daemon]\nsocket = "{socket}"\nsocket_mode = "0666"\n'
            + (f"status_per_s_per_uid = {per_s}\n" if per_s is not None else "")
            + (f"connections_per_s_per_uid = {conn_per_s}\n" if conn_per_s is not None else "")
            + f'[cgroup]\nname = "krexflood{os.getpid()}"\n[cpu]\nallow_shared = true\n'
            + (f"[warm]\npids_max = {pool_pids_max}\n" if pool_pids_max is not None else "")
        )
    argv = [sys.executable, "-m", "krexd", "--config", config, "--socket", socket]
    with open(os.path.join(workdir, "krexd.log"), "wb") as log:
        proc = subprocess.Popen(
            [*argv, "--fake-gpus", "1"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            env=_clean_env(),
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while not os.path.exists(socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"krexd did not start; see {workdir}/krexd.log")
        time.sleep(0.05)
    return proc, socket


def _holder(env: dict[str, str], regions: int) -> list[float]:
    """Entry latencies (ms) of ``regions`` regions of one command run as root."""
    out = subprocess.run(
        [*KREX, "run", "--cold", "--", sys.executable, "-c", _HOLDER, str(regions)],
        env=env,
        capture_output=True,
        timeout=600,
        check=True,
    )
    return [x[0] for x in json.loads(out.stdout.decode().strip().splitlines()[-1])]


def run(
    regions: int,
    sockets: int,
    per_s: float | None = None,
    kind: str = "status",
    conn_per_s: float | None = None,
    pool_pids_max: int | None = None,
) -> list[dict[str, Any]]:
    """Both modes on one krexd; a row each (ms, and the flood's rates).

    ``kind``: "status" (``sockets`` status requests kept outstanding),
    "connections" (``sockets`` new connections at a time, one ping each, closed)
    "admits" (``sockets`` admits kept outstanding, never placed) or
    "pool-threads" (a warm pool of ``sockets`` threads registered).
    ``per_s`` / ``conn_per_s``: krexd's status and connection paces,
    ``pool_pids_max`` its ``[warm] pids_max`` (None: defaults).
    """
    workdir = tempfile.mkdtemp(prefix="krex-flood-")
    os.chmod(workdir, 0o755)
    krexd, socket = _start_krexd(workdir, per_s, conn_per_s, pool_pids_max)
    env = dict(_clean_env(), KREX_SOCKET=socket)
    rows = []
    try:
        for mode in ("quiet", "flood"):
            flood = None
            if mode == "flood":
                flood_code = {
                    "status": _FLOOD,
                    "connections": _CHURN,
                    "admits": _ADMITS,
                    "pool-threads": _POOL_THREADS,
                }[kind]
                code = ["-m", "tests.daemon.asuser", "65534", "65534", "py", flood_code]
                flood = subprocess.Popen(
                    [sys.executable, *code, str(sockets), "600"],
                    env=env, cwd=REPO, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                pool = None
                if kind == "pool-threads" and flood.stdout is not None:
                    pool = json.loads(flood.stdout.readline())  # registered (or refused)
                time.sleep(2.0)
            t = time.monotonic()
            lat = _holder(env, regions)
            row: dict[str, Any] = {
                "mode": mode,
                "entry_p50_ms": round(_pct(lat, 0.5), 3),
                "entry_p99_ms": round(_pct(lat, 0.99), 3),
                "holder_s": round(time.monotonic() - t, 2),
            }
            if flood is not None:
                if pool is not None:
                    row["pool"] = pool
                _stop(flood)  # type: ignore[arg-type]
            rows.append(row)
        st = subprocess.run(
            [sys.executable, "-c", _KREXCTL, "status", "--json"],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        if st.returncode == 0:
            status = json.loads(st.stdout)
            rows[-1]["lanes"] = status["server"]["lanes"]
            rows[-1]["requests"] = status["server"]["requests"]
            rows[-1]["connections"] = status["connections"]
    finally:
        _stop(krexd)
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regions", type=int, default=300)
    ap.add_argument("--sockets", type=int, default=32)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument(
        "--status-per-s",
        type=float,
        default=None,
        help="krexd's [daemon] status_per_s_per_uid (default: krexd's own; 0: no pace)",
    )
    ap.add_argument(
        "--flood",
        choices=("status", "connections", "admits", "pool-threads"),
        default="status",
        help="status requests kept outstanding, connections opened, pinged and closed, "
        "admits kept outstanding (never placed: granted ones squat on slots), "
        "or a warm pool of --sockets threads",
    )
    ap.add_argument("--pools", type=int, default=1, help="--flood pool-threads: how many pools")
    ap.add_argument(
        "--pool-pids-max",
        type=int,
        default=None,
        help="krexd's [warm] pids_max (default: krexd's own; 0: no limit)",
    )
    ap.add_argument(
        "--connections-per-s",
        type=float,
        default=None,
        help="krexd's [daemon] connections_per_s_per_uid (default: krexd's own; 0: no pace)",
    )
    args = ap.parse_args()
    os.environ["FLOOD_POOLS"] = str(args.pools)  # read by the flood (the env it inherits)
    rows = run(
        args.regions,
        args.sockets,
        args.status_per_s,
        args.flood,
        args.connections_per_s,
        args.pool_pids_max,
    )
    for r in rows:
        print(
            f"{r['mode']:6s} entry p50 {r['entry_p50_ms']:7.3f} ms  "
            f"p99 {r['entry_p99_ms']:7.3f} ms  ({r['holder_s']} s)"
            + (f"  pool: {json.dumps(r['pool'])}" if "pool" in r else "")
        )
    if "lanes" in rows[-1]:
        print("status lanes after the flood:", json.dumps(rows[-1]["lanes"]))
        print("requests served in all:", rows[-1]["requests"])
        print("connections after the flood:", json.dumps(rows[-1]["connections"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
