"""Full stack over the fake driver: a sibling frozen early is fail-closed checked during the drain.

Real krexd, real cgroups, ``krex run``, the test variant of the shim
(``libkrex_shim_test.so``: its pause points, libkrex_shim/testhook.h) and
the fake driver.  Three commands beside the holder's:

* "slow", a registered sibling whose drainer stops at ``drain_ctx_claimed``
  (a context claimed, not yet synchronized, the epoch not acknowledged)
  until the test removes the pause file: the drain cannot end before that;
* "bad", ``env -u LD_PRELOAD``: it has the fake GPU open and no
  registration, so the drain freezes it at its first scan;
* the holder, entering one region.

With the drain held, bad must be checked (krexd's error line naming its
pid), ended (exit 79, from ``krex run``) and gone; the grant comes only
after the release, with none of bad's kernels after it.  Before the early
check, bad was checked only after the whole drain: it was never ended
while slow's drain was held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.fakecuda import timeline
from tests.support import JsonLineReader, ShimBuild

from .test_freeze_as_drained import FAKE_DIR, HOLDER, SIBLING, Lines, _frozen

pytestmark = [pytest.mark.root]

ATTACKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs", "attacker.py")
UNPROTECTABLE = 79
POINT = "drain_ctx_claimed"


def _wait(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_an_unprotected_sibling_frozen_early_is_ended_while_another_drains(
    krexd_factory: Any, shim_build: ShimBuild, tmp_path: Any
) -> None:
    state = os.path.join(tmp_path, "fakestate")  # who has the fake GPU open, for krexd
    k = krexd_factory(
        slots=4,
        config={"shim": {"path": str(shim_build.shim_test)}, "region": {"drain_timeout_s": 60}},
        env={"KREX_FAKE_STATE": state},
    )
    tl = os.path.join(k.workdir, "timeline")
    env = dict(k.env, LD_LIBRARY_PATH=FAKE_DIR, KREX_FAKE_TIMELINE=tl, KREX_FAKE_STATE=state)
    flag = os.path.join(tmp_path, "pause-drain")
    procs: list[subprocess.Popen[str]] = []

    def start(argv: list[str], stderr: int = subprocess.DEVNULL, **extra: str) -> Any:
        p = subprocess.Popen(
            [*k.krex, "run", "--", *argv],
            env=dict(env, **extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        procs.append(p)
        return p

    try:
        slow = Lines(
            start([sys.executable, SIBLING], KREX_TEST_PAUSE=POINT, KREX_TEST_PAUSE_FILE=flag)
        )
        slow_pid = json.loads(slow.get())["pid"]
        bad_proc = start(
            ["env", "-u", "LD_PRELOAD", sys.executable, ATTACKER, "gpu"], subprocess.PIPE
        )
        assert bad_proc.stdout is not None
        bad_pid = JsonLineReader(bad_proc.stdout, "bad", lambda: f"rc {bad_proc.poll()}").next(20)[
            "pid"
        ]
        holder = Lines(start([sys.executable, HOLDER]))
        assert holder.get() == "ready"
        time.sleep(0.3)  # bad launches on the fake GPU

        holder.send("enter")
        _wait(lambda: os.path.exists(flag), "slow's drainer to stop at its pause point")
        # The drain is held by slow.  bad must be checked, ended and gone meanwhile.
        line = f"pid {bad_pid} "
        _wait(
            lambda: any(line in s and "unprotectable" in s for s in k.log().splitlines()),
            "krexd's fail-closed line naming bad",
        )
        rc = bad_proc.wait(30)
        assert os.path.exists(flag), "slow's drain went on before bad was ended"
        assert not _frozen(slow_pid), "slow frozen before it acknowledged"
        assert holder.poll() is None, "granted while slow's drain was held"
        assert rc == UNPROTECTABLE, (rc, bad_proc.stderr.read() if bad_proc.stderr else "")
        err = bad_proc.stderr.read() if bad_proc.stderr else ""
        assert "unprotectable GPU use" in err and f"pid {bad_pid}" in err, err[-2000:]

        os.unlink(flag)  # slow's drainer synchronizes and acknowledges: the drain ends
        reply = json.loads(holder.get())
        assert reply["ok"], reply
        bad_kernels = [r for r in timeline.read(tl) if r.pid == bad_pid]
        assert bad_kernels, "bad never ran a kernel on the fake GPU"
        assert max(r.end_ns for r in bad_kernels) < reply["granted_ns"]
        gpu = k.status()["gpus"][0]["region"]
        assert gpu["regions"]["granted"] == 1 and gpu["regions"]["failed"] == 0, gpu
    finally:
        if os.path.exists(flag):
            os.unlink(flag)
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
