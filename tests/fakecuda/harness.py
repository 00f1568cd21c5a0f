"""Running programs on the fake driver from tests.

:func:`build` runs ``make -C tests/fakecuda`` once and returns where the
outputs are; :class:`FakeCuda` gives each test its own timeline and memory
state and runs fakebench, fakealloc and Python snippets against them.
Other test packages (shim, integration) can use it as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import timeline

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD = REPO / "build" / "fakecuda"

# Variables of the caller's environment that would change the fake device.
_SCRUB = (
    "CUDA_VISIBLE_DEVICES",
    "KREX_FAKE_GPUS",
    "KREX_FAKE_MEM_BYTES",
    "KREX_FAKE_STATE",
    "KREX_FAKE_TIMELINE",
    "LD_PRELOAD",
)


@dataclass(frozen=True)
class Build:
    """Paths of the built fake driver and its programs."""

    lib_dir: Path
    fakebench: Path
    fakealloc: Path


def build() -> Build:
    """Build (or bring up to date) the fake driver; raises CalledProcessError on failure."""
    subprocess.run(["make", "-s", "-C", str(HERE)], check=True, stdout=subprocess.DEVNULL)
    return Build(BUILD, BUILD / "bin" / "fakebench", BUILD / "bin" / "fakealloc")


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
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
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
    return [json.loads(line) for line in out.splitlines()]
