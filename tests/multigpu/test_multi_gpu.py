"""Several GPUs on one host (fake GPUs on CPU): per-GPU coordinators, slices, placement.

Regions on different GPUs proceed at the same time; a region on one GPU
never freezes another GPU's tenants; a tenant is confined to its GPU's CPU
slice; commands without ``--gpu`` go to the least-loaded GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.coordinator.helpers import COUNTER, HOLDER, Counters, parse_cycles, stop_all

pytestmark = [pytest.mark.root]

_AFFINITY = "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"


def _on_gpu(k: Any, gpu: int, *argv: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*k.krex, "run", "--gpu", str(gpu), "--", *argv], env=k.env, **kw)


def test_regions_on_different_gpus_overlap_and_stay_apart(krexd_factory: Any) -> None:
    k = krexd_factory(fake_gpus=4, slots=3)
    c = Counters(os.path.join(k.workdir, "counters"), 8)
    # one sibling (with a grandchild) per GPU: slots 2g, 2g+1
    sibs = [
        _on_gpu(
            k, g, sys.executable, COUNTER, c.path, str(2 * g), "--fork", stderr=subprocess.DEVNULL
        )
        for g in range(4)
    ]
    try:
        c.wait_running(list(range(8)))
        holders = [
            _on_gpu(
                k,
                g,
                sys.executable,
                HOLDER,
                c.path,
                "8",
                "--hold-s",
                "1.0",
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for g in (0, 1)
        ]
        cycles = []
        for h in holders:
            out, err = h.communicate(timeout=120)
            assert h.returncode == 0, err.decode()
            (cyc,) = parse_cycles(out)
            cycles.append(cyc)
        g0, g1 = cycles
        # Both regions were held at once (per-GPU coordinators).
        assert g0["enter_t"] < g1["exit_t"] and g1["enter_t"] < g0["exit_t"], cycles
        # A region froze its own GPU's sibling only: GPUs 2 and 3 kept counting throughout.
        for cyc in cycles:
            assert {4, 5, 6, 7} <= set(cyc["in_region_advanced"]), cyc
        assert not {0, 1} & set(g0["in_region_advanced"]), g0
        assert not {2, 3} & set(g1["in_region_advanced"]), g1
        st = k.status()
        assert [g["region"]["regions"]["completed"] for g in st["gpus"]] == [1, 1, 0, 0]
    finally:
        stop_all(sibs)


def test_tenants_are_confined_to_their_gpus_slice(krexd_factory: Any) -> None:
    ncpu = len(os.sched_getaffinity(0))
    if ncpu < 2:
        pytest.skip("needs two cores")
    k = krexd_factory(
        fake_gpus=2,
        slots=2,
        config={
            "cpu": {"reserved_cores": 0, "allow_shared": False, "slices": {"0": "0", "1": "1"}}
        },
    )
    seen = {}
    for gpu in (0, 1):
        p = _on_gpu(k, gpu, sys.executable, "-c", _AFFINITY, stdout=subprocess.PIPE)
        out, _ = p.communicate(timeout=60)
        seen[gpu] = json.loads(out)
    assert seen == {0: [0], 1: [1]}


@pytest.mark.parametrize(
    "holder_cpus, in_region", [("add", [0, 1]), ("reserved_only", [1])]
)  # fmt: skip
def test_holder_thread_gets_the_reserved_cores_in_region(
    krexd_factory: Any, holder_cpus: str, in_region: list[int]
) -> None:
    """[region] holder_cpus: reserved cores added to the thread's own, or alone."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    k = krexd_factory(
        fake_gpus=1,
        slots=2,
        config={
            "cpu": {"reserved_cores": 1, "allow_shared": False, "slices": {"0": "0-1"}},
            "region": {"holder_cpus": holder_cpus},
        },
    )
    prog = (
        "import json, os\n"
        "from krex_client import region\n"
        "before = sorted(os.sched_getaffinity(0))\n"
        "with region.critical():\n"
        "    inside = sorted(os.sched_getaffinity(0))\n"
        "after = sorted(os.sched_getaffinity(0))\n"
        "print(json.dumps([before, inside, after]))\n"
    )
    p = _on_gpu(k, 0, sys.executable, "-c", prog, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    before, inside, after = json.loads(out)
    assert (before, inside, after) == ([0], in_region, [0])


def test_commands_go_to_the_least_loaded_gpu(krexd_factory: Any) -> None:
    k = krexd_factory(fake_gpus=4, slots=4)
    shells = [
        subprocess.Popen(
            [
                *k.krex,
                "run",
                "--",
                sys.executable,
                "-c",
                "import os, time; print(os.environ['KREX_GPU'], flush=True); time.sleep(60)",
            ],
            env=k.env,
            stdout=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    try:
        gpus = []
        for s in shells:
            assert s.stdout is not None
            gpus.append(int(s.stdout.readline()))
        assert sorted(gpus) == [0, 0, 1, 1, 2, 2, 3, 3]
        used = [g["slots_used"] for g in k.status()["gpus"]]
        assert used == [2, 2, 2, 2]
    finally:
        stop_all(shells)
