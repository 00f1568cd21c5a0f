"""krexd keeps serving through ≥10,000 random and garbled frames, with bounded memory."""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import msgpack
import psutil
import pytest
import zmq

from krex_client.connection import Connection, RemoteError
from krex_client.protocol import decode_reply
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]
ERROR_NAMES = {"BAD_FRAME", "BAD_VERSION", "BAD_FIELD", "UNKNOWN_OP", "AUTH", "NO_SUCH_GPU"}
OPS = ["ping", "status", "admit", "place", "release", "region_enter", "region_exit", "x", ""]


def pack(obj: object) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def junk_value(rng: random.Random) -> object:
    return rng.choice(
        [
            None,
            True,
            -1,
            0,
            2**63 - 1,
            1.5,
            "",
            "s" * rng.randint(0, 40),
            b"\x00\xff",
            [],
            [1, "a"],
            {},
            {"k": [None]},
            {"a": 1, b"b": 2},
        ]
    )


def garbled(rng: random.Random) -> list[bytes]:
    """One message (list of frames) that must not crash krexd nor be admitted."""
    kind = rng.randrange(10)
    if kind == 0:
        return [rng.randbytes(rng.randint(0, 300))]
    if kind == 1:
        return [pack(junk_value(rng))]
    if kind == 2:  # a valid-looking request, truncated
        full = pack({"v": 1, "id": rng.randint(0, 99), "op": "ping", "body": {}})
        return [full[: rng.randint(0, len(full) - 1)]]
    if kind == 3:  # several frames in one message
        return [pack({"v": 1, "id": 1, "op": "ping"}) for _ in range(rng.randint(2, 4))]
    if kind == 4:  # wrong version
        return [pack({"v": rng.choice([0, 2, "1", None]), "id": 1, "op": "ping"})]
    if kind == 5:  # fields of random types
        msg = {
            k: junk_value(rng)
            for k in ("v", "id", "op", "tenant", "token", "body")
            if rng.random() < 0.8
        }
        msg.setdefault("v", 1)
        return [pack(msg)]
    if kind == 6:  # a known op with a garbage body (admit never gets a valid launcher)
        body = {
            rng.choice(["argv", "gpu", "pid", "launcher_pid", "epoch", "zz"]): junk_value(rng)
            for _ in range(rng.randint(0, 4))
        }
        return [pack({"v": 1, "id": rng.randint(0, 2**32), "op": rng.choice(OPS), "body": body})]
    if kind == 7:  # forged credentials
        return [
            pack(
                {
                    "v": 1,
                    "id": 3,
                    "op": rng.choice(["place", "release", "region_exit"]),
                    "tenant": rng.randint(1, 50),
                    "token": rng.randbytes(16).hex(),
                    "body": {"pid": 1},
                }
            )
        ]
    if kind == 8:  # bytes where strings belong
        return [pack({"v": 1, "id": 1, "op": b"ping", "body": {b"k": 1}})]
    return [b""]


def blast(sock: zmq.Socket[bytes], rng: random.Random, n: int) -> int:
    """Send ``n`` garbled messages, one at a time, checking each reply; returns error count."""
    errors = 0
    for _ in range(n):
        sock.send_multipart(garbled(rng))
        assert sock.poll(5000), "krexd stopped answering"
        reply = decode_reply(sock.recv())
        if not reply.ok:
            assert reply.error is not None and reply.error.name in ERROR_NAMES, reply
            assert reply.error.message
            errors += 1
    return errors


def test_garbled_frames(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=1)
    proc = psutil.Process(k.pid)
    rng = random.Random(20261129)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{k.socket}")
    try:
        errors = blast(sock, rng, 4000)  # warm-up: allocator and caches settle
        rss_warm = proc.memory_info().rss
        errors += blast(sock, rng, 6000)
        rss_end = proc.memory_info().rss
        # Oversized frames: one over the soft limit gets an answer...
        sock.send(b"\x00" * (2 << 20))
        assert sock.poll(5000)
        big = decode_reply(sock.recv())
        assert big.error is not None and big.error.name == "BAD_FRAME"
        # ...one over the hard limit makes libzmq drop that peer (no reply possible).
        rude = ctx.socket(zmq.DEALER)
        rude.setsockopt(zmq.LINGER, 0)
        rude.connect(f"ipc://{k.socket}")
        rude.send(os.urandom(17 << 20))
        rude.close()
    finally:
        sock.close()
        ctx.term()
    assert errors > 9000
    assert rss_end - rss_warm < 8 << 20, f"RSS grew {rss_end - rss_warm} bytes over 6000 frames"
    # Still serving, and nothing was admitted by garbage.
    assert k.request("ping")["pid"] == k.pid
    st = k.status()
    assert st["tenants"] == [] and st["queue"]["parked"] == 0


def test_malformed_bodies_get_bad_field_and_a_null_label_is_absent(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=1)
    mixed = {"argv": ["x"], b"label": "y"}
    with Connection(k.socket) as c:
        for op in ("ping", "status", "admit", "place", "release", "region_enter"):
            with pytest.raises(RemoteError) as info:
                c.request(op, mixed)
            assert info.value.name == "BAD_FIELD", (op, info.value)
        granted = c.request("admit", {"argv": ["x"], "label": None})
    k.request("release", {}, tenant=granted["tenant"], token=granted["token"])
    assert k.status()["tenants"] == []
    assert "Traceback" not in k.log() and "INTERNAL" not in k.log()
