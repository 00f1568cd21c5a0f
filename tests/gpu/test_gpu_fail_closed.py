"""On a real NVIDIA GPU: GPU use krex cannot drain is ended, and the region stays native.

Issue "Tenant identity" item 8: beside a holder timing GEMMs in critical
regions, a sibling runs GEMMs with ``env -u LD_PRELOAD`` (no shim), or
execs into an unshimmed program after its first GPU call.  krexd sees the
process through NVML's compute processes without a drained registration,
ends that sibling (exit 79, the process and the cause in krex run's
message) before it grants, and the holder's median region time stays
within 1% of native (the same program without krex, alone on the GPU).

    sudo .venv/bin/python -m pytest tests/gpu/test_gpu_fail_closed.py -m gpu -s

prints one table row per case (native and krex medians, ms; the sibling's
exit code).  Needs torch and nvidia-ml-py; skipped without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.root, pytest.mark.slow]

PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs", "gemm_fail_closed.py")
REGIONS = 50


def _median(out: str) -> float:
    with open(out) as f:
        return float(json.load(f)["median_ms"])


@pytest.fixture(scope="module")
def native_ms(tmp_path_factory: Any) -> float:
    out = str(tmp_path_factory.mktemp("native") / "native.json")
    subprocess.run([sys.executable, PROG, "holder", out, str(REGIONS)], check=True, timeout=600)
    return _median(out)


@pytest.mark.parametrize(
    "sibling",
    [["env", "-u", "LD_PRELOAD", sys.executable, PROG, "sibling"], [sys.executable, PROG, "exec"]],
    ids=["env-u-LD_PRELOAD", "exec-unshimmed"],
)
def test_unprotectable_sibling_is_ended_and_the_region_stays_native(
    krexd_factory: Any, native_ms: float, sibling: list[str]
) -> None:
    k = krexd_factory(fake_gpus=0, slots=3)
    sib = subprocess.Popen(
        [*k.krex, "run", "--", *sibling],
        env=k.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert sib.stdout is not None
    assert sib.stdout.readline().strip() == "started"  # its GEMMs run (unshimmed) now
    time.sleep(1.0)
    out = os.path.join(k.workdir, "holder.json")
    run = subprocess.run(
        [*k.krex, "run", "--", sys.executable, PROG, "holder", out, str(REGIONS)],
        env=k.env,
        capture_output=True,
        timeout=600,
    )
    rc = sib.wait(60)
    err = sib.stderr.read() if sib.stderr else ""
    krex_ms = _median(out) if run.returncode == 0 else float("nan")
    print(
        f"\n| {sibling[-1] if sibling[0] != 'env' else 'env -u LD_PRELOAD'} "
        f"| native {native_ms:.3f} ms | krex {krex_ms:.3f} ms "
        f"| {100 * (krex_ms / native_ms - 1):+.2f}% | sibling exit {rc} |"
    )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    assert rc == 79, err[-2000:]
    assert "unprotectable GPU use" in err and "pid " in err
    assert abs(krex_ms / native_ms - 1) <= 0.01, (native_ms, krex_ms)
