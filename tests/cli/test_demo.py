"""``make demo`` (``python -m krex_cli.demo``) runs the short replay end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from krex_cli.demo import hand_over

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
    # Under the tables: one line saying what ran, one per metric saying what it means.
    lines = out.splitlines()
    last_table = max(i for i, line in enumerate(lines) if line.startswith("|"))
    below = lines[last_table + 1 :]
    (ran,) = [line for line in below if line.startswith("what ran: ")]
    assert "workloads/simulated.py" in ran
    assert "--mode native --gpus 0`" in ran and "--mode krex --concurrency 4 --fake-gpus 1" in ran
    # Gap buckets of fewer than 5 pairs (9 pairs here in all) say so instead of a rate.
    flips = lines.index("Pairwise flip rate by native gap (flips/pairs):")
    flip_rows = [line for line in lines[flips:] if line.startswith("| 2-krex |")][:1]
    assert flip_rows and "too few to judge" in flip_rows[0], out
    assert not re.search(r"\((\d+)/[1-4]\)", flip_rows[0]), flip_rows
    explained = {
        name
        for line in below
        if line.startswith("  ")
        for name in line.strip().split(": ", 1)[0].split(", ")
    }
    headers = {
        cell.strip()
        for line in lines
        if line.startswith("| run |")
        for cell in line.strip("|").split("|")
    }
    counts = {"run", "mode", "concurrency", "role", "commands", "completed", "failed"}
    columns = {"<0.1ms", "0.1-1ms", "1-10ms", ">=10ms", "0-1%", "1-2%", "2-5%", "5-10%"}
    columns |= {"10-20%", ">20%"}  # band and gap columns: explained by their tables' lines
    assert "median tau-b" in headers and "P" in headers
    assert headers - counts - columns <= explained, explained
    assert {"P by kernel-duration band", "flip rate by native gap"} <= explained


def test_run_through_sudo_leaves_its_files_to_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through sudo the report the demo points at belongs to the user who ran it."""
    work = tmp_path / "krex-demo-x"
    (work / "report").mkdir(parents=True)
    (work / "report" / "report.md").write_text("# report\n")
    (work / "trace.jsonl").write_text("")
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65534")
    hand_over(work)
    owned = {p: (p.stat().st_uid, p.stat().st_gid) for p in [work, *work.rglob("*")]}
    assert set(owned.values()) == {(65534, 65534)}, owned
    monkeypatch.delenv("SUDO_UID")
    (work / "late").write_text("")
    hand_over(work)  # run as root itself: the files stay root's
    assert (work / "late").stat().st_uid == 0
