"""Helpers of the ``krex run --warm`` tests: a krexd with warm pools, cold and warm runs.

:class:`Pools` wraps a krexd started with a ``[warm]`` section (cheap
modules instead of torch) and a private pool directory
(``XDG_RUNTIME_DIR`` under the test's tmp_path).  :meth:`Pools.cold` runs
``krex run --cold``, :meth:`Pools.warm` runs ``krex run --warm -v`` and
checks from its debug line whether a pool served it; :meth:`Pools.ready`
waits until a pool serves a given interpreter, options and environment.
"""

from __future__ import annotations

import atexit
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.krexd import Krexd

PY = sys.executable
PROGS = Path(__file__).resolve().parent / "progs"
PROBE = PROGS / "warm_probe.py"
SERVED = "krex: warm: served by pool"
#: Variables krexd or krex run give each command a value of its own.
PER_COMMAND = ("KREX_TENANT", "KREX_TOKEN", "KREX_SLOTS", "KREX_ADMIT_MS")


def warm_config(**warm: Any) -> dict[str, dict[str, Any]]:
    """A krexd config with ``[warm]`` (default: modules json, idle 60 s) and ``warm`` on top."""
    return {"warm": {"modules": ["json"], "idle_s": 60.0, **warm}}


def short_runtime_dir() -> Path:
    """A fresh private directory with a short path, for ``XDG_RUNTIME_DIR``: a pool
    socket's path must fit sun_path (108 bytes), and a pool directory too long for one
    is refused for a shared fallback (krex_cli/warm/pooldir.py) that parallel tests would
    then share.  Removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="kxdg-"))
    atexit.register(shutil.rmtree, str(path), True)
    return path


class Pools:
    """A krexd with warm pools, and the runs of one test against it."""

    def __init__(self, k: Krexd, tmp_path: Path) -> None:
        self.k = k
        self.xdg = short_runtime_dir()
        self.env = dict(k.env, XDG_RUNTIME_DIR=str(self.xdg))
        self.env.pop("PYTHONUNBUFFERED", None)

    @property
    def dir(self) -> Path:
        """The pool directory."""
        return self.xdg / "krex"

    def run(
        self,
        start: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        """``krex run START [OPTIONS] -- ARGV`` (START: ``--cold``, or ``--warm`` and ``-v``)."""
        opts = [start, "-v", *options] if start == "--warm" else [start, *options]
        p: subprocess.CompletedProcess[str] = subprocess.run(
            [*self.k.krex, "run", *opts, "--", *argv],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=kw.pop("timeout", 60),
            **kw,
        )
        return p

    def cold(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """A cold run."""
        return self.run("--cold", argv, **kw)

    def warm(
        self, argv: list[str], served: bool = True, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """A ``--warm -v`` run; asserts a pool served it (or did not, ``served=False``).

        The debug lines are removed from the returned stderr.
        """
        p = self.run("--warm", argv, **kw)
        debug = [ln for ln in p.stderr.splitlines() if ln.startswith("krex: warm: ")]
        assert any(SERVED in ln for ln in debug) == served, (p.returncode, p.stderr)
        p.stderr = "".join(
            ln for ln in p.stderr.splitlines(keepends=True) if not ln.startswith("krex: warm: ")
        )
        p.debug = debug  # type: ignore[attr-defined]
        return p

    def ready(
        self, flags: tuple[str, ...] = (), env: dict[str, str] | None = None, timeout_s: float = 60
    ) -> None:
        """Run ``PY FLAGS -c pass`` warm until a pool serves it (the first run starts it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            p = self.run("--warm", [PY, *flags, "-c", "pass"], env=env)
            assert p.returncode == 0, p.stderr
            if SERVED in p.stderr:
                return
            assert time.monotonic() < deadline, f"no pool came up: {p.stderr}\n{self.logs()}"
            time.sleep(0.2)

    def logs(self) -> str:
        """Every pool log of this test."""
        return "\n".join(p.read_text() for p in sorted(self.dir.glob("*.log")))

    def pools(self) -> list[dict[str, Any]]:
        """krexd's rows of the registered pools."""
        return list(self.k.status()["warm"]["pools"])


def probe(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The probe's JSON line, with what differs per command by design made equal."""
    assert p.returncode == 0, p.stderr
    got: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    got["cgroup"] = re.sub(r"/t\d+$", "/tN", got["cgroup"].strip(), flags=re.M)
    slots = got["env"].get("KREX_SLOTS_FD")
    if slots is not None:  # krex run's own choice of number: the slot memory's, named
        got["fds"]["slots"] = got["fds"].pop(slots)
        got["env"]["KREX_SLOTS_FD"] = "<per command>"
    for var in PER_COMMAND:
        if var in got["env"]:
            got["env"][var] = "<per command>"
    return got


def diff(cold: dict[str, Any], warm: dict[str, Any]) -> dict[str, Any]:
    """The keys whose values differ, with both values (one level into dict values)."""
    out: dict[str, Any] = {}
    for key in sorted(cold.keys() | warm.keys()):
        a, b = cold.get(key, "<absent>"), warm.get(key, "<absent>")
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out[key] = diff(a, b)
        else:
            out[key] = (a, b)
    return out


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def source_as_code(path: Path) -> str:
    """A file's source, for ``python -c``."""
    return path.read_text()
