"""Full stack over the fake HIP runtime: no HIP sibling kernel runs inside a region.

Real krexd with simulated AMD GPUs (``--fake-vendor amd``: commands get
``ROCR_VISIBLE_DEVICES=GPU-6b72657866616b00``, which the fake HIP runtime
accepts), real cgroups, the shim LD_PRELOADed by ``krex run``, the fake
runtime's device timeline (tests/fakehip over tests/fakecuda) as the
witness.  Siblings (hipbench, linked and through dlsym) launch HIP kernels
constantly; a HIP holder enters and leaves regions.  Enforced, no sibling
kernel overlaps a region; ungated (``[region] enforce = false``), the same
check finds overlaps, so it can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.fakecuda import timeline
from tests.support import HIP_DIR, fake_driver_env, make

pytestmark = [pytest.mark.root]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs", "hip_holder.py")


def _run(krexd_factory: Any, cycles: int, enforce: bool) -> tuple[int, list[list[int]], list[Any]]:
    make("fakehip")
    extra = "" if enforce else "[region]\nenforce = false\n"
    k = krexd_factory(slots=6, extra=extra, args=["--fake-vendor", "amd"])
    env = fake_driver_env(k.env, k.workdir)
    env["LD_LIBRARY_PATH"] = f"{HIP_DIR}:{FAKE_DIR}"
    tl = env["KREX_FAKE_TIMELINE"]
    hipbench = str(HIP_DIR / "bin" / "hipbench")
    sibs = [
        subprocess.Popen(
            [
                *k.krex, "run", "--", hipbench, "--link", link, "--mode", mode,
                "--seconds", "300", "--kernel-ns", str(150_000 + 50_000 * i),
                "--streams", "2", "--sync-every", "4",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i, (link, mode) in enumerate(
            [("direct", "module"), ("dlsym", "launch"), ("direct", "launch")]
        )
    ]  # fmt: skip
    try:
        run = subprocess.run(
            [*k.krex, "run", "--", sys.executable, HOLDER, str(cycles), "11"],
            env=env,
            capture_output=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr.decode()[-3000:]
    finally:
        for s in sibs:
            s.terminate()
        for s in sibs:
            s.wait(30)
    out = json.loads(run.stdout.decode().strip().splitlines()[-1])
    return out["pid"], out["regions"], timeline.read(tl)


def _violations(holder: int, regions: list[list[int]], records: list[Any]) -> int:
    return sum(len(timeline.overlapping(records, s, e, exclude_pid=holder)) for s, e in regions)


def test_no_hip_sibling_kernel_inside_a_region(krexd_factory: Any) -> None:
    holder, regions, records = _run(krexd_factory, 150, enforce=True)
    assert len(regions) == 150
    siblings = {r.pid for r in records if r.pid != holder}
    assert len(siblings) == 3, "all three HIP siblings must have launched"
    assert sum(1 for r in records if r.pid != holder) > 300  # they kept working between regions
    assert _violations(holder, regions, records) == 0


def test_ungated_hip_regions_do_overlap_siblings(krexd_factory: Any) -> None:
    holder, regions, records = _run(krexd_factory, 60, enforce=False)
    assert _violations(holder, regions, records) > 0
