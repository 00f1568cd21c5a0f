"""Benchmark scripts that start their own krexd: they work in any environment and leave nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.root, pytest.mark.slow]


def processes_naming(text: str) -> list[int]:
    """Pids of the processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry))
    return found


def test_region_latency_ignores_an_inherited_krex_socket_and_stops_its_krexd(
    tmp_path: Path,
) -> None:
    work = tmp_path / "tmp"
    work.mkdir()
    # Run inside another krex environment: KREX_SOCKET names some other krexd's socket.
    env = dict(os.environ, TMPDIR=str(work), KREX_SOCKET=str(tmp_path / "other.sock"))
    argv = [sys.executable, "benchmarks/region_latency.py", "--siblings", "1", "--regions", "3"]
    try:
        p = subprocess.run(
            [*argv, "--sibling", "spin"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.splitlines()[1].split()[:3] == ["1", "spin", "3"]  # 1 sibling, 3 regions
        assert not (tmp_path / "other.sock").exists()
        assert processes_naming(str(work)) == []  # its krexd and commands are gone
        assert list(work.iterdir()) == []  # and so is its working directory
    finally:
        for pid in processes_naming(str(work)):  # what a failing run left behind
            os.kill(pid, signal.SIGTERM)
