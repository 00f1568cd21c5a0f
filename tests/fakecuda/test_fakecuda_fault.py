"""Fatal faults on the fake driver: sticky in the faulting process, GPU-wide under KREX_FAKE_MPS.

A kernel named ``krex_fault...`` (``fakebench --fault-after N``) faults:
without MPS only its process fails; with the modelled MPS server every
client of that GPU gets the error at its next call until the server file is
replaced (what a restart of the control daemon does).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.fakecuda.harness import FakeCuda

ILLEGAL_ADDRESS = 700


def _start(fc: FakeCuda, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(fc.build.fakebench), *args],
        env=fc.env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(p: subprocess.Popen[str]) -> tuple[int, dict[str, Any]]:
    out, err = p.communicate(timeout=60)
    return p.returncode, json.loads(out)


def test_a_fault_is_sticky_in_its_process_and_nobody_else_notices(fc: FakeCuda) -> None:
    healthy = _start(fc, "--seconds", "1.0", "--kernel-ns", "100000")
    time.sleep(0.2)
    faulty = _start(fc, "--count", "100", "--fault-after", "3", "--kernel-ns", "100000")
    rc, summary = _finish(faulty)
    assert rc == 1
    assert summary["error"]["code"] == ILLEGAL_ADDRESS
    assert summary["error"]["name"] == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert summary["launches"] == 3, "the call after the faulting launch failed"
    rc, summary = _finish(healthy)
    assert rc == 0 and summary["error"] is None


def test_under_mps_a_fault_reaches_every_client_until_the_server_restarts(
    fc: FakeCuda, tmp_path: Path
) -> None:
    server = tmp_path / "server"
    mps = {"KREX_FAKE_MPS": "1", "KREX_FAKE_MPS_STATE": str(server)}
    healthy = [_start(fc, "--seconds", "3", "--kernel-ns", "100000", **mps) for _ in range(2)]
    time.sleep(0.3)
    faulty = _start(fc, "--count", "100", "--fault-after", "3", **mps)
    rc, summary = _finish(faulty)
    assert rc == 1 and summary["error"]["code"] == ILLEGAL_ADDRESS
    for p in healthy:
        rc, summary = _finish(p)
        assert rc == 1, "a co-tenant of the faulted server went on"
        assert summary["error"]["code"] == ILLEGAL_ADDRESS
        assert summary["launches"] > 0
    # A new client of the broken server is refused; one of a restarted server runs.
    rc, summary = _finish(_start(fc, "--count", "3", **mps))
    assert rc == 1 and summary["error"]["name"] == "CUDA_ERROR_DEVICE_UNAVAILABLE"
    server.unlink()
    rc, summary = _finish(_start(fc, "--count", "3", **mps))
    assert rc == 0 and summary["error"] is None


def test_the_mps_log_writes_the_real_servers_fatal_line(fc: FakeCuda, tmp_path: Path) -> None:
    """The wording of the H200's MPS server (docs/design/faults.md); krexd only detects
    from it, so that the client it names is the faulting one here does not matter."""
    logs = tmp_path / "log"
    logs.mkdir()
    env = {
        "KREX_FAKE_MPS": "log",
        "KREX_FAKE_MPS_STATE": str(tmp_path / "server"),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
    }
    rc, summary = _finish(_start(fc, "--count", "10", "--fault-after", "2", **env))
    assert rc == 1
    lines = (logs / "server.log").read_text().splitlines()
    assert len(lines) == 1
    assert (
        f"Client {{PID: {summary['pid']}, Context: 1}} encountered a fatal GPU error." in lines[0]
    )


def test_a_bad_mps_mode_is_refused(fc: FakeCuda) -> None:
    p = _start(fc, "--count", "1", KREX_FAKE_MPS="yes")
    rc, summary = _finish(p)
    assert rc == 1 and summary["error"]["call"] == "cuInit"
