"""Region entry opens no per-sibling kernel file once krexd has opened it (krexd.system.heldfiles).

Real krexd over the fake driver, three busy siblings under the real shim
(registered, drained, frozen, checked), a holder that enters one region per
line it is sent.  krexd starts with a ``sitecustomize`` that logs every
``os.open`` and ``open()`` it makes.  The first region opens each sibling's
``/proc/<pid>/stat`` and cgroup files; the second must open none of them:
they are held.  When a tenant ends, krexd holds nothing under its cgroup.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from krexd.hardware.inventory import fake_gpus
from krexd.memory.sources import FakeStateSource

pytestmark = [pytest.mark.root]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
FAKEGPU = os.path.join(REPO, "tests", "fakecuda", "fakegpu.py")
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs", "stepped_holder.py")

_SITE = """
import builtins, os
_path = os.environ.get("KREX_TEST_OPEN_LOG")
if _path:
    _fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _os_open, _open = os.open, builtins.open

    def _note(path):
        try:
            os.write(_fd, f"{os.getpid()} {os.fsdecode(path)}\\n".encode())
        except (TypeError, OSError):
            pass  # a descriptor, not a path

    def _logged_os_open(path, *args, **kwargs):
        _note(path)
        return _os_open(path, *args, **kwargs)

    def _logged_open(file, *args, **kwargs):
        _note(file)
        return _open(file, *args, **kwargs)

    os.open = _logged_os_open
    builtins.open = _logged_open
"""


def _opened(log: Path, pid: int, start: int, end: int | None = None) -> list[str]:
    """Paths process ``pid`` asked to open between byte offsets ``start`` and ``end`` of ``log``."""
    data = log.read_bytes()[start:end].decode(errors="replace")
    return [ln.split(" ", 1)[1] for ln in data.splitlines() if ln.startswith(f"{pid} ")]


def _per_sibling(paths: list[str], trees: list[str]) -> list[str]:
    """Those of ``paths`` that region entry reads per sibling: /proc stat, cgroup files."""
    return [
        p
        for p in paths
        if re.fullmatch(r"/proc/\d+/stat", p) or any(p.startswith(t + "/") for t in trees)
    ]


def _held_under(pid: int, directories: list[str]) -> list[str]:
    """What process ``pid``'s descriptors open under any of ``directories``."""
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if any(target.startswith(d + "/") for d in directories):
            out.append(target)
    return out


def _wait(what: str, ok: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := ok()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


def test_a_second_region_opens_no_sibling_file_and_an_ended_tenant_leaves_none_open(
    built: None, krexd_factory: Any, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITE)
    log = tmp_path / "opens"
    state = str(tmp_path / "fakestate")
    pythonpath = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    k = krexd_factory(
        slots=5,
        env={"PYTHONPATH": pythonpath, "KREX_TEST_OPEN_LOG": str(log), "KREX_FAKE_STATE": state},
    )
    env = dict(k.env, LD_LIBRARY_PATH=FAKE_DIR, KREX_FAKE_STATE=state)
    argv = [sys.executable, FAKEGPU, "--seconds", "300", "--kernel-ns", "200000"]
    sibs = [
        subprocess.Popen(
            [*k.krex, "run", "--", *argv, "--sync-every", "4"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(3)
    ]
    holder = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, HOLDER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "ready\n"
        source = FakeStateSource(fake_gpus(1), state)

        def on_gpu() -> list[dict[str, Any]] | None:
            rows = [t for t in k.status()["tenants"] if t["pid"] is not None]
            users = source.users(0) or set()
            return rows if len(rows) == 4 and all(t["pid"] in users for t in rows) else None

        tenants = _wait("three siblings and the holder on the fake GPU", on_gpu)
        trees = list(k.cgroup_dirs)

        def region() -> int:
            """One region of the holder; the log's size after it."""
            assert holder.stdin is not None and holder.stdout is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.stdout.readline().startswith("done"), k.log()[-3000:]
            return log.stat().st_size

        first = region()
        second = region()
        frozen = _per_sibling(_opened(log, k.pid, 0, first), trees)
        assert any(re.fullmatch(r"/proc/\d+/stat", p) for p in frozen)  # the log sees opens
        assert any(p.endswith("/cgroup.freeze") for p in frozen)
        assert _per_sibling(_opened(log, k.pid, first, second), trees) == []
        gpu = k.status()["gpus"][0]["region"]["regions"]
        assert gpu["granted"] == 2 and gpu["failed"] == 0

        # A tenant that ends leaves no descriptor under its cgroup directories.
        ended = next(t for t in tenants if t["launcher_pid"] == sibs[0].pid)
        relative = os.path.relpath(ended["cgroup"], k.cgroup_dirs[0])
        dirs = [os.path.join(tree, relative) for tree in trees]
        assert _held_under(k.pid, dirs), "krexd held none of the sibling's cgroup files"
        sibs[0].terminate()
        sibs[0].wait(30)
        _wait(
            "the tenant's end",
            lambda: all(t["id"] != ended["id"] for t in k.status()["tenants"]),
        )
        assert _held_under(k.pid, dirs) == []
    finally:
        holder.stdin.close()
        holder.wait(30)
        for s in sibs:
            s.terminate()
        for s in sibs:
            s.wait(30)
