"""Bounded inputs: argv capped at admit, command lines cut in status, large replies read.

Each fails on the krexd before: a 1 MB argv was admitted, and two tenants of 600 KB argv
made root's ``krexctl status`` fail (``frame ... exceeds 1048576``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable

import msgpack
import pytest

from krex_client.protocol import MAX_FRAME_BYTES, decode_reply
from tests.support.krexd import Krexd

Factory = Callable[..., Krexd]


def test_a_reply_larger_than_a_request_frame_is_read() -> None:
    body = {"queue": ["x" * 1000] * (2 * MAX_FRAME_BYTES // 1000)}
    frame = msgpack.packb({"v": 1, "id": 7, "ok": True, "body": body})
    assert len(frame) > MAX_FRAME_BYTES
    assert decode_reply(frame).body == body


@pytest.mark.root
def test_argv_is_capped_at_admit_and_cut_in_status(krexd_factory: Factory) -> None:
    k = krexd_factory()
    huge = subprocess.run(
        [*k.krex, "run", "--", "true", "x" * 70_000],
        env=k.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert huge.returncode == 65, huge.stderr
    lines = huge.stderr.strip().splitlines()
    assert len(lines) == 1 and "max_argv_bytes" in lines[0], huge.stderr
    runs = [
        subprocess.Popen(
            [*k.krex, "run", "--", "sh", "-c", "sleep 20", "y" * 60_000],
            env=k.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 20
        while len(k.status()["tenants"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        st = subprocess.run(
            [*k.krexctl, "status", "--json"], env=k.env, capture_output=True, text=True
        )
        assert st.returncode == 0, st.stderr
        tenants = json.loads(st.stdout)["tenants"]
        assert len(tenants) == 2
        for t in tenants:
            shown = t["command"]
            assert sum(len(a) for a in shown[:-1]) <= 512 and "more characters" in shown[-1]
    finally:
        for p in runs:
            p.kill()
            p.wait()
