"""Admission latency: how long from a slot being freed to the next parked tenant's grant.

    python benchmarks/admission_latency.py [--iterations N] [--socket PATH | --start]

Each iteration: tenant A holds the only slot of GPU 0; tenant B's ``admit``
is parked in krexd (verified through ``status``); then the clock starts, A
sends ``release``, and the clock stops when B's ``admit`` reply arrives.  The
figure therefore includes the whole release (coordinator hook, cgroup kill
and removal, slot accounting) plus the grant and one reply.  B then holds the
slot for the next iteration.

``--start`` (default when no --socket is given; needs root) runs a private
krexd with one fake GPU and one slot.  With ``--socket`` the krexd there must
have a GPU 0 with ``slots_per_gpu = 1`` and no other tenants.
Prints a summary and one JSON line (``--json``) with p50/p90/p99/max in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import zmq

from krex_client.connection import Connection

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_krexd  # noqa: E402

from krex_client.protocol import Request, decode_reply, encode_request


class Client:
    """One DEALER socket speaking the krex protocol, with explicit send/receive."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], socket: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"ipc://{socket}")
        self.tenant: int | None = None
        self.token: str | None = None
        self._id = 0

    def send(self, op: str, body: dict[str, Any]) -> None:
        self._id += 1
        self.sock.send(encode_request(Request(op, self._id, body, self.tenant, self.token)))

    def recv(self, timeout_ms: int = 10_000) -> dict[str, Any]:
        if not self.sock.poll(timeout_ms):
            raise TimeoutError("no reply from krexd")
        reply = decode_reply(self.sock.recv())
        if not reply.ok:
            raise RuntimeError(f"krexd error: {reply.error}")
        return reply.body

    def admit_send(self) -> None:
        self.send("admit", {"argv": ["bench"], "gpu": 0, "launcher_pid": os.getpid()})

    def admit_recv(self) -> None:
        body = self.recv()
        self.tenant, self.token = int(body["tenant"]), str(body["token"])


def start_krexd(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    """A krexd with one fake GPU and 1 slot(s) on ``workdir/krexd.sock``, ready."""
    return fake_krexd.start_krexd(workdir, 1, "krexbench")


def parked(socket: str) -> int:
    with Connection(socket) as c:
        return int(c.request("status")["queue"]["parked"])


def measure(socket: str, iterations: int) -> list[float]:
    """Latencies (ms) of ``iterations`` slot hand-overs on GPU 0."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    out: list[float] = []
    try:
        holder = Client(ctx, socket)
        holder.admit_send()
        holder.admit_recv()
        for _ in range(iterations):
            nxt = Client(ctx, socket)
            nxt.admit_send()
            while parked(socket) != 1:
                time.sleep(0.0005)
            t0 = time.perf_counter()
            holder.send("release", {"exit_code": 0})
            nxt.admit_recv()
            out.append((time.perf_counter() - t0) * 1e3)
            holder.recv()  # the release reply
            holder.sock.close()
            holder = nxt
        holder.send("release", {})
        holder.recv()
        holder.sock.close()
    finally:
        ctx.term()
    return out


def main() -> int:
    """Run the benchmark; print a summary (and JSON with --json)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--socket", help="use the krexd at this socket instead of starting one")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args()
    proc = None
    workdir = tempfile.mkdtemp(prefix="krex-bench-")
    socket = args.socket
    if socket is None:
        proc, socket = start_krexd(workdir)
    try:
        lat = sorted(measure(socket, args.iterations))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    result = {
        "iterations": len(lat),
        "p50_ms": round(statistics.median(lat), 3),
        "p90_ms": round(pct(0.90), 3),
        "p99_ms": round(pct(0.99), 3),
        "max_ms": round(lat[-1], 3),
        "cpus": os.cpu_count(),
    }
    print(
        f"admission latency (slot freed -> next tenant granted) over {len(lat)} hand-overs: "
        f"p50 {result['p50_ms']} ms, p90 {result['p90_ms']} ms, p99 {result['p99_ms']} ms, "
        f"max {result['max_ms']} ms"
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
