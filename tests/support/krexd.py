"""A real krexd for tests: the handle ``krexd_factory`` (tests/conftest.py) returns, and
the test configuration it writes.

* :class:`Krexd` — one started krexd: socket, environment for clients, log,
  ``status()``, ``stop()`` (which checks that the socket and cgroups are gone).
* :func:`make_config`, :func:`render_toml` — the test config as TOML.
* :data:`KREX`, :data:`KREXCTL` — argv prefixes of the ``krex`` and ``krexctl``
  commands of this checkout; :data:`REPO` — the checkout (a str).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from krex_client.connection import Connection, KrexUnavailable
from tests.support import REPO as _REPO
from tests.support import clean_env

REPO = str(_REPO)
KREX = [sys.executable, "-m", "krex_cli"]
KREXCTL = [sys.executable, "-c", "import sys; from krex_cli.krexctl import main; sys.exit(main())"]


class Krexd:
    """A krexd started by :func:`krexd_factory` (see the module docstring)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], socket: str, workdir: str, name: str, log_path: str
    ) -> None:
        self.proc = proc
        self.socket = socket
        self.workdir = workdir
        self.cgroup_name = name
        self.log_path = log_path
        self.env = clean_env(KREX_SOCKET=socket)
        self.krex = list(KREX)
        self.krexctl = list(KREXCTL)
        self.cgroup_dirs: list[str] = []

    @property
    def pid(self) -> int:
        """krexd's pid."""
        return self.proc.pid

    def log(self) -> str:
        """Everything krexd wrote to stderr so far."""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def request(
        self,
        op: str,
        body: dict[str, Any] | None = None,
        timeout_s: float = 5.0,
        tenant: int | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        """One request on a fresh connection; returns the reply body."""
        with Connection(self.socket, tenant, token, timeout_s=timeout_s) as conn:
            return conn.request(op, body)

    def status(self) -> dict[str, Any]:
        """The ``status`` op's reply."""
        return self.request("status")

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until krexd answers ``ping``; fail with its log if it exits or hangs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"krexd exited with {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket):
                try:
                    self.request("ping", timeout_s=0.5)
                    return
                except KrexUnavailable:
                    pass
            time.sleep(0.05)
        pytest.fail(f"krexd not ready after {timeout_s}s:\n{self.log()}")

    def stop(self, check: bool = True, timeout_s: float = 20.0) -> int:
        """SIGTERM krexd, wait; with ``check``, assert socket and cgroups are gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"krexd ignored SIGTERM for {timeout_s}s:\n{self.log()}")
        if check:
            assert not os.path.exists(self.socket), "krexd left its socket behind"
            left = [d for d in self.cgroup_dirs if os.path.exists(d)]
            assert not left, f"krexd left cgroups behind: {left}\n{self.log()}"
        return self.proc.returncode


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def render_toml(tables: dict[str, dict[str, Any]]) -> str:
    """Render ``{table: {key: value}}`` (a value may be a sub-table dict) as TOML."""
    out: list[str] = []
    for table, keys in tables.items():
        out.append(f"[{table}]")
        subs = {k: v for k, v in keys.items() if isinstance(v, dict)}
        out += [f"{k} = {_toml_value(v)}" for k, v in keys.items() if k not in subs]
        for sub, inner in subs.items():
            out.append(f"[{table}.{sub}]")
            out += [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in inner.items()]
    return "\n".join(out) + "\n"


def make_config(
    socket: str, name: str, slots: int, overrides: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """A test config: private socket and cgroup name, shared slices allowed (2-core CI),
    commands started cold unless ``--warm`` or ``[warm] start = "warm"``."""
    tables: dict[str, dict[str, Any]] = {
        "daemon": {"socket": socket, "log_level": "debug"},
        "admission": {"slots_per_gpu": slots},
        "cgroup": {"name": name},
        "cpu": {"allow_shared": True},
        # Cold unless a test asks for warm starts: a pool outlives its command (until
        # krexd is gone), and most tests are about something else.
        "warm": {"start": "cold"},
    }
    for table, keys in (overrides or {}).items():
        tables.setdefault(table, {}).update(keys)
    return tables
