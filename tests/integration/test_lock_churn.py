"""Commands that start and end during regions, with the driver lock: nothing stalls.

Real krexd (the driver lock through the fake driver, as on a GPU), real
cgroups, ``krex run`` and the shim.  While a holder enters and leaves
regions, short commands start, create their context (often in the middle
of an entry's drain, after it read the GPU's users), launch and exit, three
at a time.  The check: the holder finishes, every short command exits 0,
and no kernel of another process runs inside a region.

What it caught, each now with its own deterministic test: krexd locking a
newcomer that the drain had frozen unlocked (the driver never returns from
that; a replay on an H100 stalled so, docs/bench/driver-lock.md;
tests/coordinator/test_driver_locking.py), and the fake driver handing a
dying process's half-taken lock to the next process given its record (that
process's calls then blocked for good, its drain timed out and its command
was ended; tests/fakecuda/test_fakecuda_checkpoint.py).  Run as a bounded
stress test: about 8 s, 10-30 short commands.
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
from tests.support import fake_driver_env

pytestmark = [pytest.mark.root]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAKEGPU = os.path.join(REPO, "tests", "fakecuda", "fakegpu.py")
HOLDER = os.path.join(HERE, "progs", "timeline_holder.py")


def test_commands_starting_during_regions_never_stall_an_entry(krexd_factory: Any) -> None:
    k = krexd_factory(slots=6)
    env = fake_driver_env(k.env, k.workdir)
    short = [*k.krex, "run", "--", sys.executable, FAKEGPU, "--count", "30"]
    short += ["--kernel-ns", "200000", "--sync-every", "3"]
    holder = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, HOLDER, "300", "11"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    done: list[int] = []
    running: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + 240
    try:
        while holder.poll() is None:
            assert time.monotonic() < deadline, f"the holder stalled:\n{k.log()[-3000:]}"
            for p in [p for p in running if p.poll() is not None]:
                running.remove(p)
                done.append(p.returncode)
            while len(running) < 3:
                running.append(
                    subprocess.Popen(
                        short, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                    )
                )
            time.sleep(0.02)
        for p in running:
            done.append(p.wait(60))
        out, err = holder.communicate()
        assert holder.returncode == 0, err.decode()[-3000:]
    finally:
        for p in running:
            p.kill()
            p.wait()
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert len(done) >= 10, f"only {len(done)} short commands ran beside the holder"
    why = [line for line in k.log().splitlines() if "ended by krex" in line]
    assert done == [0] * len(done), (done, why)
    regions = json.loads(out.decode().strip().splitlines()[-1])
    records = timeline.read(env["KREX_FAKE_TIMELINE"])
    inside = [
        r for s, e in regions["regions"]
        for r in timeline.overlapping(records, s, e, {regions["pid"]})
    ]  # fmt: skip
    assert inside == []
