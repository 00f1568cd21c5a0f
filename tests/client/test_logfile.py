"""Log files another user may have prepared: links, FIFOs, held locks (krex_client.logfile).

Each fails on the version before: the region log and the grant log followed symbolic
links, were created 0644, and a lock held by another process hung the region log's
writer after its first region (a FIFO at the grant log's path was already refused).
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from krex_cli import grantlog
from krex_client import logfile
from krex_client.record import Recorder


def test_a_new_log_is_0600_and_lines_append(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    old = os.umask(0)
    try:
        assert logfile.append_line(path, b"a\n")
    finally:
        os.umask(old)
    logfile.append_line(path, b"b\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Path(path).read_bytes() == b"a\nb\n"


def test_a_symbolic_link_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "root-only"
    target.write_bytes(b"")
    link = tmp_path / "log"
    link.symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        logfile.append_line(str(link), b"x\n")
    assert target.read_bytes() == b""


def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    t = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        logfile.append_line(fifo, b"x\n")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # with a reader too
    try:
        with pytest.raises(OSError, match="not a regular file"):
            logfile.append_line(fifo, b"x\n")
    finally:
        os.close(reader)
    assert time.monotonic() - t < 1


def test_a_lock_held_by_another_process_delays_a_line_briefly(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        t = time.monotonic()
        rec = Recorder(str(path))
        rec.append({"epoch": 1})
        assert time.monotonic() - t < 2
        assert b'"epoch":1' in path.read_bytes()
        with open(path, "a") as f, pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still held by the other
    finally:
        holder.kill()
        holder.wait()


def test_the_grant_log_refuses_a_link_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"")
    link = tmp_path / "grants"
    link.symlink_to(target)
    grantlog.append(str(link), {"tenant": 1, "gpu": 0, "env": {}}, 1.0)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "symbolic link" in err[0]
    assert target.read_bytes() == b""
