"""Flags a tenant forges in its own slot memory stall nobody (real krexd, fake driver).

``progs/flagforger.py`` registers, then forges: the memory-wait flag of its
own (verified) slot, honoured only for ``[memory] oom_wait_s`` plus a grace,
after which krexd ends it (exit 79) and admission goes on; or, under MPS, a
fault record in a slot of no process, which opens no incident and pauses no
admission (docs/design/memory.md, docs/design/faults.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.mps.test_mps import FAKE
from tests.support import JsonLineReader

pytestmark = [pytest.mark.root]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
FORGER = os.path.join(HERE, "progs", "flagforger.py")
UNPROTECTABLE = 79


def _forger(k: Any, env: dict[str, str], mode: str) -> tuple[subprocess.Popen[str], Any]:
    p = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, FORGER, mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    lines = JsonLineReader(p.stdout, "forger", lambda: f"rc {p.poll()}")
    assert lines.next(20)["forged"] == mode
    return p, lines


@pytest.mark.usefixtures("built")
def test_a_forged_memory_wait_closes_admission_only_for_its_bound(
    krexd_factory: Any, tmp_path: Any
) -> None:
    state = os.path.join(tmp_path, "fakestate")
    k = krexd_factory(
        slots=4,
        config={"memory": {"oom_wait_s": 1, "refresh_ms": 20, "admission": False}},
        env={"KREX_FAKE_STATE": state},
    )
    env = dict(k.env, LD_LIBRARY_PATH=FAKE_DIR, KREX_FAKE_STATE=state)
    forger, _ = _forger(k, env, "wait")
    try:
        t0 = time.monotonic()
        late = subprocess.run(
            [*k.krex, "run", "--", "true"], env=env, capture_output=True, text=True, timeout=20
        )
        waited = time.monotonic() - t0
        assert late.returncode == 0, late.stderr
        # Honoured at most oom_wait_s (1 s) + the 2 s grace, then the forger is ended.
        assert waited < 12, waited
        assert forger.wait(10) == UNPROTECTABLE
        err = forger.stderr.read() if forger.stderr else ""
        assert "claimed to wait for GPU memory" in err, err
        assert "claimed to wait for GPU memory" in k.log()
    finally:
        if forger.poll() is None:
            forger.kill()
            forger.wait()


@pytest.mark.usefixtures("built")
def test_a_forged_fault_record_of_no_process_pauses_no_admission(
    krexd_factory: Any, tmp_path: Any
) -> None:
    k = krexd_factory(fake_gpus=1, slots=4, extra=f'[mps]\nenabled = true\ncontrol = "{FAKE}"\n')
    env = dict(
        k.env,
        LD_LIBRARY_PATH=FAKE_DIR,
        KREX_FAKE_STATE=os.path.join(tmp_path, "fake.state"),
        KREX_FAKE_GPUS="1",
        KREX_FAKE_MPS="1",
    )
    forger, _ = _forger(k, env, "fault")
    try:
        time.sleep(0.6)  # three polls of the fault monitor, several sweeps
        late = subprocess.run(
            [*k.krex, "run", "--", "true"], env=env, capture_output=True, text=True, timeout=10
        )
        assert late.returncode == 0, late.stderr
        faults = k.status()["faults"]
        assert faults["incidents"] == [] and faults["totals"]["incidents"] == 0, faults
        assert forger.poll() is None, "a record in a slot of no process is ignored, not punished"
    finally:
        forger.kill()
        forger.wait()
