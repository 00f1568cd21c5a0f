"""On a real NVIDIA GPU: auto-regions compile each autotuner configuration outside the region.

Skipped without a GPU.  Real Triton and PyTorch in the interpreter running
the tests; the regions are answered in-process (``progs/autotune_primed.py``),
so neither krexd nor root is needed.  A fresh ``TRITON_CACHE_DIR`` makes each
configuration's first launch a real compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

PROG = Path(__file__).resolve().parent / "progs" / "autotune_primed.py"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("scope", "order", "regions"),
    [("step", "interleaved", 1), ("step", "sequential", 1), ("config", "", 2)],
)
def test_each_configuration_is_compiled_before_its_region(
    tmp_path: Path, scope: str, order: str, regions: int
) -> None:
    """``step``: both configurations timed in one region, interleaved or in turn;
    ``config``: one region each."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(
        KREX_AUTOREGION="1",
        KREX_SOCKET="/nonexistent.sock",
        KREX_TENANT="1",
        KREX_TOKEN="t",
        KREX_REGION_WARM_MS="0",
        KREX_AUTOTUNE_REGION=scope,
        KREX_AUTOTUNE_ORDER=order,
        TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
        PYTHONPATH=os.pathsep.join([str(REPO / "python_client"), env.get("PYTHONPATH", "")]),
    )
    res = subprocess.run(
        [sys.executable, str(PROG)], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    print(json.dumps(report))
    launches = report["launches"]
    assert report["ops"] == ["region_enter", "region_exit"] * regions, report
    for block in (256, 1024):
        held = [h for b, h in launches if b == block]
        # The first launch (the compile) ran outside; the timed ones inside.
        assert held[0] is False and True in held, (block, launches)
    if scope == "step":  # both compiles before the region, then every timed launch in it
        first_in = [h for _, h in launches].index(True)
        assert {b for b, h in launches[:first_in]} == {256, 1024}, launches
        timed = [h for _, h in launches[first_in:]]
        # The last launch is the real call, after the step's region.
        assert timed[:-1] == [True] * (len(timed) - 1) and timed[-1] is False, launches
        blocks = [b for b, _ in launches[first_in:-1]]
        switches = sum(a != b for a, b in zip(blocks, blocks[1:], strict=False))
        # In turn: all of 256's launches, then all of 1024's; interleaved: back and forth.
        assert (switches == 1) if order == "sequential" else (switches > 10), blocks
