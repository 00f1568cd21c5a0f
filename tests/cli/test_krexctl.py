"""krexctl status: table, --json, LSB exit codes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import pytest

from krex_cli.krexctl import render
from tests.support.krexd import KREXCTL, Krexd

Factory = Callable[..., Krexd]


def krexctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KREXCTL, *args], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.root
def test_status_table_and_json(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=2, slots=1)
    run = subprocess.Popen([*k.krex, "run", "--gpu", "1", "--", "sleep", "30"], env=k.env)
    deadline = time.monotonic() + 20
    while not k.status()["tenants"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    parked = subprocess.Popen([*k.krex, "run", "--gpu", "1", "--", "true"], env=k.env)
    try:
        while k.status()["queue"]["parked"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        p = krexctl("status", "--socket", k.socket)
        assert p.returncode == 0, p.stderr
        out = p.stdout
        assert f"pid {k.pid}" in out and "fake GPU 1" in out and "sleep 30" in out
        assert "1 parked" in out and k.status()["cgroups"]["backend"] in out
        j = krexctl("status", "--json", env=k.env)
        st = json.loads(j.stdout)
        assert j.returncode == 0
        assert st["gpus"][1]["slots_used"] == 1 and st["gpus"][0]["slots_used"] == 0
        assert st["tenants"][0]["command"] == ["sleep", "30"] and st["tenants"][0]["gpu"] == 1
        assert st["queue"]["parked"] == 1
        assert {"version", "uptime_s", "cgroups", "gpus", "tenants", "queue"} <= set(st)
        # The gate word as krexd reads it: open, then closed by a real region on GPU 0.
        assert st["gpus"][0]["gate_word"] is None and _gate_column(out) == ["open", "open"]
        holder = subprocess.Popen(
            [*k.krex, "run", "--gpu", "0", "--", sys.executable, "-c", HOLD_REGION], env=k.env
        )
        try:
            while (word := k.status()["gpus"][0]["gate_word"]) is None:
                assert time.monotonic() < deadline + 20 and holder.poll() is None
                time.sleep(0.05)
            table = krexctl("status", "--socket", k.socket).stdout
            assert _gate_column(table) == [f"t{word['holder']} e{word['epoch']}", "open"]
        finally:
            holder.wait(30)
    finally:
        run.terminate()
        run.wait(20)
        parked.wait(20)


#: Holds a critical region for 4 s (the gate closed by krexd itself, for status to show).
HOLD_REGION = (
    "import time\nfrom krex_client import region\nwith region.critical():\n    time.sleep(4)\n"
)


def _gate_column(table: str) -> list[str]:
    """The GATE cells of the GPU table of ``krexctl status``."""
    lines = table.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("GPU "))
    start = lines[head].index("GATE")
    end = lines[head].index("REGIONS")
    rows = lines[head + 1 :]
    rows = [r for r in rows[: rows.index("")] if not r.startswith("CPUS:")]  # the legend
    return [r[start:end].strip() for r in rows]


def _column(table: str, name: str, after: str) -> list[str]:
    """The cells of column ``name`` (up to column ``after``) of the GPU table."""
    lines = table.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("GPU "))
    start, end = lines[head].index(name), lines[head].index(after)
    rows = lines[head + 1 :]
    return [r[start:end].strip() for r in rows[: rows.index("")] if not r.startswith("CPUS:")]


def test_cpu_columns_are_cpuset_lists_under_clear_headers() -> None:
    st = {"version": "x", "pid": 1, "uptime_s": 1.0, "state": "running", "socket": "s"}
    gpus = [
        {"index": 0, "name": "g0", "slots_used": 0, "slots_total": 4, "gate": None,
         "slice": {"cores": "0-1", "reserved": "1", "tenant_cores": "0", "shared": False}},
        {"index": 1, "name": "g1", "slots_used": 0, "slots_total": 4, "gate": None,
         "slice": {"cores": [2, 3, 4, 7], "reserved": "", "tenant_cores": "2,3,4,7"}},
    ]  # fmt: skip
    out = render({**st, "gpus": gpus, "tenants": []})
    assert "RESERVED 1" not in out and "TENANT CORES" not in out
    assert _column(out, "SLICE CPUS", "RESERVED CPUS") == ["0-1", "2-4,7"]
    assert _column(out, "RESERVED CPUS", "TENANT CPUS") == ["1", "-"]
    assert _column(out, "TENANT CPUS", "HOLDER") == ["0", "2-4,7"]
    assert "CPUS: cpuset lists (0-2,5 = CPUs 0, 1, 2 and 5)" in out


def test_regions_column_shows_failed_and_recovered_regions() -> None:
    gpu = {
        "index": 0,
        "name": "fake GPU 0",
        "slots_used": 1,
        "slots_total": 4,
        "gate": "/run/krex/krex-gpu0.gate",
        "gate_word": {"holder": 4, "epoch": 9},
        "holder": 4,
        "region": {
            "regions": {"granted": 5, "completed": 2, "failed": 2, "recovered": 1},
            "entry_ms": {"n": 0},
        },
    }
    st = {"version": "x", "pid": 1, "uptime_s": 1.0, "state": "running", "socket": "s"}
    out = render({**st, "gpus": [gpu]})
    assert "2/5 (2 failed, 1 recovered)" in out and _gate_column(out) == ["t4 e9"]
    gpu["region"]["regions"].update(failed=0, recovered=0)  # type: ignore[index]
    out = render({**st, "gpus": [gpu, {**gpu, "index": 1, "gate": None}]})
    assert "2/5  " in out and "failed" not in out and _gate_column(out) == ["t4 e9", "-"]


def test_not_running_is_3() -> None:
    p = krexctl("status", "--socket", "/nonexistent-krex/krexd.sock")
    assert p.returncode == 3 and "not running" in p.stderr


def test_not_running_json_is_a_json_object_and_3() -> None:
    sock = "/nonexistent-krex/krexd.sock"
    p = krexctl("status", "--json", "--socket", sock)
    assert p.returncode == 3
    st = json.loads(p.stdout)
    assert st["state"] == "not running" and st["socket"] == sock and sock in st["error"]


def test_stale_socket_file_is_3() -> None:
    d = tempfile.mkdtemp(prefix="krex-")
    path = os.path.join(d, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens
    assert krexctl("status", "--socket", path).returncode == 3


@pytest.mark.slow  # waits out krexctl's 3 s timeout
@pytest.mark.parametrize("as_json", [False, True])
def test_listening_but_not_answering_is_4(as_json: bool) -> None:
    d = tempfile.mkdtemp(prefix="krex-")
    path = os.path.join(d, "mute.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    try:
        if as_json:
            p = krexctl("status", "--json", "--socket", path)
            assert p.returncode == 4 and json.loads(p.stdout)["state"] == "unknown"
        else:
            p = krexctl("status", "--socket", path)
            assert p.returncode == 4 and "unknown" in p.stderr
    finally:
        s.close()
