"""Running programs on the fake driver from tests.

:class:`Build` says where the outputs of ``make fakecuda`` are (the
``fakecuda_build`` fixture of tests/conftest.py builds them once);
:class:`FakeCuda` gives each test its own timeline and memory state and runs
fakebench, fakealloc and Python snippets against them.  Other test packages
(shim, memory, integration) use it as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import FAKE_DIR, clean_env, json_lines

from . import timeline

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Build:
    """Paths of the built fake driver and its programs."""

    lib_dir: Path
    fakebench: Path
    fakealloc: Path

    @property
    def fakelock(self) -> Path:
        """The checkpoint-lock driver program (progs/fakelock.c)."""
        return self.lib_dir / "bin" / "fakelock"

    @property
    def fakedeep(self) -> Path:
        """The program with a second, RTLD_DEEPBIND copy of the driver (progs/fakedeep.c)."""
        return self.lib_dir / "bin" / "fakedeep"

    @classmethod
    def default(cls) -> Build:
        """Where ``make fakecuda`` puts them (``build/fakecuda``)."""
        return cls(FAKE_DIR, FAKE_DIR / "bin" / "fakebench", FAKE_DIR / "bin" / "fakealloc")


@dataclass
class FakeCuda:
    """One test's fake device: a timeline file and a memory state file under ``workdir``."""

    build: Build
    workdir: Path

    @property
    def timeline_path(self) -> Path:
        """The KREX_FAKE_TIMELINE file."""
        return self.workdir / "timeline"

    @property
    def state_path(self) -> Path:
        """The KREX_FAKE_STATE file."""
        return self.workdir / "fakecuda.state"

    def env(self, **overrides: str) -> dict[str, str]:
        """Environment for a process on this fake device (``overrides`` added last)."""
        env = clean_env()
        env["LD_LIBRARY_PATH"] = str(self.build.lib_dir)
        env["KREX_FAKE_TIMELINE"] = str(self.timeline_path)
        env["KREX_FAKE_STATE"] = str(self.state_path)
        env["PYTHONPATH"] = str(HERE)
        env.update(overrides)
        return env

    def records(self) -> list[timeline.Record]:
        """The timeline so far."""
        return timeline.read(self.timeline_path, missing_ok=True)

    def bench(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        """Run fakebench with ``args``; return its JSON summary (asserts it exits 0)."""
        proc = subprocess.run(
            [str(self.build.fakebench), *args],
            env=dict(env) if env is not None else self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, f"fakebench {args}: rc {proc.returncode}\n{proc.stderr}"
        summary: dict[str, Any] = json.loads(proc.stdout)
        return summary

    def lock_steps(self, *steps: str | int, timeout: float = 30) -> list[dict[str, Any]]:
        """Run fakelock with ``steps`` (``"lock", pid, "sleep", 300, "unlock", pid``, ...);
        return its JSON lines, one per step but ``sleep`` (any exit status)."""
        proc = subprocess.run(
            [str(self.build.fakelock), *map(str, steps)],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode in (0, 1), f"fakelock {steps}: rc {proc.returncode}\n{proc.stderr}"
        return json_lines(proc.stdout)

    def alloc_proc(
        self, *steps: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start fakealloc with ``steps``; stdin/stdout are pipes (see :func:`read_step`)."""
        return subprocess.Popen(
            [str(self.build.fakealloc), *steps],
            env=dict(env) if env is not None else self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def python(
        self, code: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a fresh interpreter on this device (``fakegpu`` importable)."""
        return subprocess.run(
            [sys.executable, "-c", code],
            env=dict(env) if env is not None else self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python_json(self, code: str, env: Mapping[str, str] | None = None) -> Any:
        """Run ``code`` (which prints one JSON document) and return the document."""
        proc = self.python(code, env)
        assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr}"
        return json.loads(proc.stdout)


def read_step(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Read the next JSON line a fakealloc process printed."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "fakealloc ended without output"
    step: dict[str, Any] = json.loads(line)
    return step


def run_steps(fc: FakeCuda, steps: Sequence[str]) -> list[dict[str, Any]]:
    """Run fakealloc to completion; return all its step lines."""
    proc = fc.alloc_proc(*steps)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"fakealloc {steps}: rc {proc.returncode}"
    return json_lines(out)
