"""Running programs on the fake HIP runtime from tests.

:class:`FakeHip` is tests/fakecuda's :class:`~tests.fakecuda.harness.FakeCuda`
(one test's timeline and memory state, the fake CUDA driver's programs) plus
the fake ``libamdhip64``: its processes find both libraries, Python snippets
import ``hipgpu`` as well as ``fakegpu``, and :meth:`FakeHip.hipbench` runs
hipbench.  Both fakes drive one simulated GPU, so a HIP tenant and a CUDA
tenant can share it in one test.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fakecuda.harness import HERE as FAKECUDA_HERE
from tests.fakecuda.harness import FakeCuda
from tests.support import HIP_DIR

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class HipBuild:
    """Paths of the built fake HIP runtime and hipbench."""

    lib_dir: Path
    hipbench: Path

    @classmethod
    def default(cls) -> HipBuild:
        """Where ``make fakehip`` puts them (``build/fakehip``)."""
        return cls(HIP_DIR, HIP_DIR / "bin" / "hipbench")


@dataclass
class FakeHip(FakeCuda):
    """A fake device for HIP tenants (and CUDA ones): :class:`FakeCuda` plus ``hip``."""

    hip: HipBuild = HipBuild.default()

    def env(self, **overrides: str) -> dict[str, str]:
        """Environment for a process on this fake device (``overrides`` added last)."""
        env = super().env()
        env["LD_LIBRARY_PATH"] = f"{self.hip.lib_dir}:{self.build.lib_dir}"
        env["PYTHONPATH"] = f"{HERE}:{FAKECUDA_HERE}"
        env.update(overrides)
        return env

    def hipbench_proc(
        self, *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start hipbench with ``args``; stdout is a pipe."""
        return subprocess.Popen(
            [str(self.hip.hipbench), *args],
            env=dict(env) if env is not None else self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def hipbench(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        """Run hipbench with ``args``; return its JSON document (asserts it exits 0)."""
        proc = self.hipbench_proc(*args, env=env)
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"hipbench {args}: rc {proc.returncode}\n{err}"
        summary: dict[str, Any] = json.loads(out)
        return summary
