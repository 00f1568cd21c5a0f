"""Full stack over the fake driver: no sibling kernel runs inside any region.

Real krexd, real cgroups, the real shim LD_PRELOADed by ``krex run``, the
fake driver's device timeline (tests/fakecuda) as the witness.  Eight
siblings, with one to three launching threads each, launch kernels
constantly; one holder enters and leaves regions at random moments.
With regions enforced, no sibling kernel overlaps a region; ungated
(``[region] enforce = false``), the same check finds overlaps, so it can
fail.  Each runs over both fakes (``gpu_api``): the CUDA driver on a
simulated NVIDIA GPU and the HIP runtime on a simulated AMD GPU, the same
programs driving either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.fakecuda import timeline
from tests.support import HIP_DIR, GpuApi

pytestmark = [pytest.mark.root]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
SHIM = os.path.join(REPO, "build", "lib", "libkrex_shim.so")
FAKEGPU = os.path.join(REPO, "tests", "fakecuda", "fakegpu.py")
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs", "timeline_holder.py")


def _sibling(api: GpuApi, i: int) -> list[str]:
    """Sibling ``i``'s command: kernels of 100-380 us (a region every ~30 ms on two busy
    cores), 1-3 launching threads (each thread's calls count in its mark; hipbench:
    streams).  Over HIP, every other one is hipbench (linked calls, hipLaunchKernel and
    hipModuleLaunchKernel in turn) beside the Python tenants (dlsym'ed calls, ctypes)."""
    kernel_ns, threads = str(100_000 + 40_000 * i), str(1 + i % 3)
    if api.name == "hip" and i % 2:
        mode = ("launch", "module")[i // 2 % 2]
        hipbench = str(HIP_DIR / "bin" / "hipbench")
        return [hipbench, "--link", "direct", "--mode", mode, "--seconds", "300",
                "--kernel-ns", kernel_ns, "--streams", threads, "--sync-every", "4"]  # fmt: skip
    return [sys.executable, FAKEGPU, "--seconds", "300", "--kernel-ns", kernel_ns,
            "--sync-every", "4", "--threads", threads]  # fmt: skip


def _run(
    krexd_factory: Any, api: GpuApi, cycles: int, enforce: bool
) -> tuple[int, list[list[int]], list[Any]]:
    if not (os.path.exists(SHIM) and os.path.exists(os.path.join(FAKE_DIR, "libcuda.so.1"))):
        pytest.fail("build the shim and the fake driver first: make")
    extra = "" if enforce else "[region]\nenforce = false\n"
    k = krexd_factory(slots=10, extra=extra, args=list(api.krexd_args))
    env = api.env(k.env, k.workdir)
    tl = env["KREX_FAKE_TIMELINE"]
    sibs = [
        subprocess.Popen(
            [*k.krex, "run", "--", *_sibling(api, i)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(8)
    ]
    try:
        run = subprocess.run(
            [*k.krex, "run", "--", sys.executable, HOLDER, str(cycles), "7"],
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


@pytest.mark.slow
@pytest.mark.serial  # nine busy tenants: beside other tests they slowed them (and it) tenfold
def test_no_sibling_kernel_inside_any_region(krexd_factory: Any, gpu_api: GpuApi) -> None:
    """1,000 regions over the CUDA driver; 400 over HIP (the same shim protocol, its own
    hooks and drain: enough to meet every sibling's launch kinds many times)."""
    cycles = 1000 if gpu_api.name == "cuda" else 400
    holder, regions, records = _run(krexd_factory, gpu_api, cycles, enforce=True)
    assert len(regions) == cycles
    siblings = {r.pid for r in records if r.pid != holder}
    assert len(siblings) == 8, "all eight siblings must have launched"
    # Siblings kept working between regions (the check is not vacuous) ...
    assert sum(1 for r in records if r.pid != holder) > 2 * cycles
    # ... and never inside one.
    assert _violations(holder, regions, records) == 0


def test_ungated_regions_do_overlap_siblings(krexd_factory: Any, gpu_api: GpuApi) -> None:
    holder, regions, records = _run(krexd_factory, gpu_api, 100, enforce=False)
    assert _violations(holder, regions, records) > 0
