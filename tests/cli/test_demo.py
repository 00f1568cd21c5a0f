"""``make demo`` (``python -m krex_cli.demo``) runs the short replay end to end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_demo_replays_native_and_krex_and_prints_the_summary() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("on a GPU host the demo runs the PyTorch corpus (see tests/gpu)")
    run = subprocess.run(
        [sys.executable, "-m", "krex_cli.demo"], cwd=REPO, capture_output=True, timeout=300
    )
    out = run.stdout.decode()
    assert run.returncode == 0, out[-3000:] + run.stderr.decode()[-3000:]
    assert "no GPU on this host" in out and "fake CUDA driver" in out
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| 1-native |") or line.startswith("| 2-krex |")
    ]
    # both runs in the throughput table, every command completed
    throughput = [r for r in rows if "| 9 | 9 | 0 |" in r]
    assert len(throughput) == 2, out
