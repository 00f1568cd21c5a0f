"""A full file system under the state directory: krexd fails at start with one line, or lives on.

The gate's space is reserved when krexd creates it (posix_fallocate), so a
full state directory stops the start with one line naming the directory;
once started, nothing krexd maps there can fault when the disk fills
(before gate v5 the sparse gate file made krexd die with SIGBUS at start,
or at its first ``status`` after the disk filled).  The state directory is
a small tmpfs mounted by the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.root]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
HOLDER = os.path.join(REPO, "tests", "integration", "progs", "timeline_holder.py")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "state"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mnt)], check=True
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    """Write zeros under ``path`` until the file system is full."""
    fd = os.open(path / f"filler{len(os.listdir(path))}", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096) > 0:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_full_state_dir_fails_at_start_with_one_line(krexd_factory: Any, small_fs: Path) -> None:
    fill(small_fs)
    k = krexd_factory(config={"daemon": {"state_dir": str(small_fs)}}, wait=False)
    assert k.proc.wait(30) != 0
    log = k.log()
    lines = [ln for ln in log.splitlines() if ln.startswith("krexd: ")]
    assert lines == [
        f"krexd: cannot create the gate of GPU 0 in {small_fs}: No space left on device"
    ], log
    assert "Traceback" not in log


def test_state_dir_filling_up_later_harms_nothing(krexd_factory: Any, small_fs: Path) -> None:
    k = krexd_factory(config={"daemon": {"state_dir": str(small_fs)}})
    fill(small_fs)
    assert k.status()["state"] == "running"
    env = dict(k.env, LD_LIBRARY_PATH=FAKE_DIR, KREX_FAKE_STATE=str(small_fs.parent / "fake"))
    run = subprocess.run(
        [*k.krex, "run", "--", sys.executable, HOLDER, "20", "1"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert k.proc.poll() is None and k.status()["state"] == "running"
