"""The pool's zygote alone (no krexd, no root): what it imports, serves, refuses, and when it ends.

The zygote (``krex_cli/warm/krexpool_zygote.py``) is started here as its
keeper starts it: by file path, stdin and stdout pipes, settings on stdin.
Requests are sent with ``krex_cli.warm.client.PoolSession``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from krex_cli.warm import client
from krex_cli.warm.keeper import ZYGOTE

PROGS = Path(__file__).resolve().parent / "progs"


class Zygote:
    """A zygote under test: ``proc``, its socket ``path``, its ``first`` word (ready/refused)."""

    def __init__(self, tmp_path: Path, modules: list[str], idle_s: float = 30.0) -> None:
        self.path = str(tmp_path / "pool.sock")
        self.log = tmp_path / "pool.log"
        env = dict(os.environ, KREX_SHIM_DEFER="1")
        env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(PROGS)]).strip(":")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, ZYGOTE],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd="/",
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        settings = {"socket": self.path, "key": "k", "version": "v", "idle_s": idle_s}
        self.proc.stdin.write((json.dumps({**settings, "modules": modules}) + "\n").encode())
        self.proc.stdin.flush()
        self.first: dict[str, Any] = json.loads(self.proc.stdout.readline() or b"{}")

    def session(self) -> client.PoolSession:
        """A connection whose ``hello`` was answered."""
        s = client.PoolSession(self.path)
        assert s.hello()["key"] == "k"
        return s

    def start(self, code: str, env: dict[str, str] | None = None) -> tuple[client.PoolSession, int]:
        """``-c code`` forked and waiting for ``go``: (session, pid)."""
        s = self.session()
        fields = {"mode": "code", "target": code, "args": [], "argv": ["python", "-c", code]}
        return s, s.start(fields, env if env is not None else dict(os.environ))

    def close(self) -> None:
        """Close its stdin (as a keeper that lost krexd does) and wait for it."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(30)


@pytest.fixture
def zygotes(tmp_path: Path) -> Iterator[list[Zygote]]:
    made: list[Zygote] = []
    yield made
    for z in made:
        z.close()


def _status(s: client.PoolSession, pid: int) -> int | None:
    pidfd = os.pidfd_open(pid)
    try:
        s.go()
        return s.wait(pidfd, time.monotonic() + 30)
    finally:
        os.close(pidfd)


def test_missing_modules_are_skipped_and_commands_run(
    zygotes: list[Zygote], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    z = Zygote(tmp_path, ["json", "no_such_module_krex"])
    zygotes.append(z)
    assert z.first == {
        "ready": True,
        "pid": z.proc.pid,
        "modules": ["json"],
        "skipped": ["no_such_module_krex"],
    }
    s, pid = z.start("import sys; print('ran', sys.argv); sys.exit(4)")
    status = _status(s, pid)
    assert status is not None and os.waitstatus_to_exitcode(status) == 4
    assert "ran ['-c']" in capfd.readouterr().out  # our stdout, passed to the command


def test_abort_runs_nothing(zygotes: list[Zygote], tmp_path: Path) -> None:
    z = Zygote(tmp_path, [])
    zygotes.append(z)
    marker = tmp_path / "ran"
    s, pid = z.start(f"open({str(marker)!r}, 'w')")
    pidfd = os.pidfd_open(pid)  # before abort: the aborted child exits, and is reaped, at once
    s.abort()
    assert s.wait(pidfd, time.monotonic() + 30) == 0
    os.close(pidfd)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("module", "why"),
    [("thread_at_import", "thread(s) running"), ("broken_at_import", "broken on purpose")],
)
def test_a_pool_refuses_to_serve_after_an_unclean_import(
    zygotes: list[Zygote], tmp_path: Path, module: str, why: str
) -> None:
    z = Zygote(tmp_path, ["json", module])
    zygotes.append(z)
    assert why in z.first.get("refused", ""), z.first
    assert z.proc.wait(30) == 0 and not os.path.exists(z.path)


def test_stop_accepting_but_finish_the_running_command(
    zygotes: list[Zygote], tmp_path: Path
) -> None:
    z = Zygote(tmp_path, [])
    zygotes.append(z)
    s, pid = z.start("import time; time.sleep(1); raise SystemExit(9)")
    pidfd = os.pidfd_open(pid)
    s.go()
    assert z.proc.stdin is not None
    z.proc.stdin.close()  # the keeper lost krexd
    deadline = time.monotonic() + 10
    while os.path.exists(z.path):  # no new requests ...
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status = s.wait(pidfd, time.monotonic() + 30)  # ... but the running one reports its end
    os.close(pidfd)
    assert status is not None and os.waitstatus_to_exitcode(status) == 9
    assert z.proc.wait(30) == 0


def test_an_idle_pool_exits(zygotes: list[Zygote], tmp_path: Path) -> None:
    z = Zygote(tmp_path, [], idle_s=1.0)
    zygotes.append(z)
    assert z.first.get("ready")
    t0 = time.monotonic()
    assert z.proc.wait(30) == 0
    assert 0.9 < time.monotonic() - t0 < 10
    assert not os.path.exists(z.path)
    assert "idle for 1 s" in z.log.read_text()


def test_a_child_cannot_see_the_pool_s_descriptors(
    zygotes: list[Zygote], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    z = Zygote(tmp_path, [])
    zygotes.append(z)
    s, pid = z.start("import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))")
    assert _status(s, pid) == 0
    seen = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    mine = sorted(fd for fd in range(3, 1024) if _inheritable(fd))
    expected = {0, 1, 2, *mine}  # krex run's inheritable ones (here: this process's)
    assert expected <= set(seen) and len(set(seen) - expected) == 1  # + the listing's own


def _inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False


def test_an_open_gpu_device_file_is_found(tmp_path: Path) -> None:
    """The zygote's "driver initialised" signal: a device file (here a stand-in) open in it."""
    from krex_cli.warm import krexpool_zygote

    device = tmp_path / "nvidiactl"
    device.write_bytes(b"")
    prefixes = (str(tmp_path / "nvidia"),)
    assert krexpool_zygote._gpu_device_open(prefixes) is None
    with open(device, "rb"):
        assert krexpool_zygote._gpu_device_open(prefixes) == str(device)
    assert krexpool_zygote._gpu_device_open(prefixes) is None


def test_a_mapped_gpu_device_file_is_found_after_its_descriptor_closed(tmp_path: Path) -> None:
    """A driver maps its device files: closing the descriptor does not hide it."""
    import mmap

    from krex_cli.warm import krexpool_zygote

    device = tmp_path / "nvidia0"
    device.write_bytes(b"\0" * 4096)
    prefixes = (str(tmp_path / "nvidia"),)
    with open(device, "r+b") as f:
        m = mmap.mmap(f.fileno(), 4096)
    try:
        assert krexpool_zygote._gpu_device_open(prefixes) == str(device)
    finally:
        m.close()
    assert krexpool_zygote._gpu_device_open(prefixes) is None


def test_a_torch_pool_adds_what_torch_compile_imports() -> None:
    from krex_cli.warm.krexpool_zygote import COMPILE_MODULES, import_list

    assert import_list(["json"]) == (["json"], [])
    assert import_list(["torch", "triton"]) == (["torch", "triton"], list(COMPILE_MODULES))
    assert {"torch._dynamo", "torch._inductor.config"} <= set(COMPILE_MODULES)
    configured = ["torch", "torch._dynamo"]
    assert import_list(configured) == (configured, list(COMPILE_MODULES[1:]))


def _fake_torch(root: Path, broken: str | None) -> None:
    """A package ``torch`` with the compile modules (``broken``: one that raises when imported)."""
    files = dict.fromkeys(
        ("torch/__init__.py", "torch/_dynamo/__init__.py", "torch/_inductor/__init__.py"), ""
    )
    files["torch/_inductor/config.py"] = files["torch/_inductor/compile_fx.py"] = ""
    if broken is not None:
        files[broken.replace(".", "/") + ".py"] = "raise RuntimeError('broken on purpose')\n"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("broken", [None, "torch._inductor.compile_fx"])
def test_the_compile_modules_are_optional(
    zygotes: list[Zygote], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str | None
) -> None:
    fake = tmp_path / "site"
    _fake_torch(fake, broken)
    monkeypatch.setenv("PYTHONPATH", str(fake))
    z = Zygote(tmp_path, ["torch"])
    zygotes.append(z)
    compile_modules = ["torch._dynamo", "torch._inductor.config", "torch._inductor.compile_fx"]
    assert z.first.get("ready") is True, z.first
    if broken is None:
        assert z.first["modules"] == ["torch", *compile_modules] and z.first["skipped"] == []
    else:  # one failed in the trial: none imported, the pool serves all the same
        assert z.first["modules"] == ["torch"] and z.first["skipped"] == compile_modules
    s, pid = z.start("import sys; sys.exit('torch._dynamo' in sys.modules and 3 or 4)")
    status = _status(s, pid)
    assert status is not None and os.waitstatus_to_exitcode(status) == (4 if broken else 3)
