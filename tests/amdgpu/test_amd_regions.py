"""On a real AMD GPU: the device-clock proof that no sibling kernel runs inside a region.

The proof of tests/gpu/test_gpu_regions.py, over ROCm: CuPy built for HIP,
the shim's HIP gating, ``wall_clock64()`` stamps (tests/gpu/progs/stamp.py).
Skipped without ``/dev/kfd`` (``amd_gpu``) or CuPy; not yet run on AMD hardware.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.gpu.test_gpu_regions import region_proof

pytestmark = [pytest.mark.amd_gpu, pytest.mark.root, pytest.mark.slow]


@pytest.mark.parametrize("enforce", [True, False])
def test_no_sibling_kernel_runs_inside_a_region(krexd_factory: Any, enforce: bool) -> None:
    pytest.importorskip("cupy", reason="the stamp kernels need CuPy for ROCm")
    region_proof(krexd_factory, enforce)
