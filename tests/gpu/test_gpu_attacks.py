"""On a real GPU: hostile and unusual tenants get no kernel into a region (device-clock proof).

Each scene runs a private krexd on the real GPU (driver lock as shipped,
``auto``), one honest stamping sibling (``stamp.py sibling``), one tenant
doing what the issue "Exclusivity the tenant cannot subvert" measured
(``progs/gpu_attacker.py``), and a holder entering 20 regions.  Every
kernel of every process stamps ``%globaltimer``; the check is that no
kernel of a process that krex did not end overlaps a region's kernel, and
that honest tenants are never ended.  ``KREX_GPU_ATTACKS_OUT`` names a JSON
file to which each scene's figures are appended (docs/bench/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support import JsonLineReader

pytestmark = [pytest.mark.gpu, pytest.mark.root, pytest.mark.slow]

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")
STAMP = os.path.join(PROGS, "stamp.py")
ATTACKER = os.path.join(PROGS, "gpu_attacker.py")
UNPROTECTABLE = 79

SCENES: dict[str, tuple[list[str], bool]] = {
    # name: (argv prefix before "gpu_attacker.py MODE OUT SECONDS", run through krex run)
    "self-ack": ([], True),
    "capture-busy": ([], True),
    "env -u LD_PRELOAD": (["env", "-u", "LD_PRELOAD"], True),
    "sanitized child": ([], True),
    "outside krex": ([], False),
    "RTLD_DEEPBIND": ([], True),
}
MODES = {
    "self-ack": "self-ack",
    "capture-busy": "capture-busy",
    "env -u LD_PRELOAD": "gpu",
    "sanitized child": "sanitized",
    "outside krex": "gpu",
    "RTLD_DEEPBIND": "deepbind",
}
HONEST = {"capture-busy", "RTLD_DEEPBIND"}  # must never be ended


def _overlaps(holder: list[list[int]], other: list[list[int]]) -> int:
    return sum(1 for h0, h1 in holder for s0, s1 in other if s0 < h1 and h0 < s1)


def _load(path: str) -> list[list[int]] | None:
    import numpy as np

    return np.load(path).tolist() if os.path.exists(path) else None


def _record(row: dict[str, Any]) -> None:
    out = os.environ.get("KREX_GPU_ATTACKS_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("name", list(SCENES))
def test_no_attacker_kernel_runs_inside_a_region(krexd_factory: Any, name: str) -> None:
    k = krexd_factory(fake_gpus=0, slots=4)
    prefix, through_krex = SCENES[name]
    sib_out = os.path.join(k.workdir, "sib.npy")
    att_out = os.path.join(k.workdir, "att.npy")
    sib = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, STAMP, "sibling", sib_out, "14"], env=k.env
    )
    argv = [*prefix, sys.executable, ATTACKER, MODES[name], att_out, "16"]
    att = subprocess.Popen(
        [*k.krex, "run", "--", *argv] if through_krex else argv,
        env=k.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert att.stdout is not None
    lines = JsonLineReader(att.stdout, "attacker", lambda: f"rc {att.poll()}")
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(sib_out + ".started"):
            assert time.monotonic() < deadline, "the sibling never started"
            time.sleep(0.1)
        while not any(x.get("started") for x in lines.lines):
            lines.next(120)
        hout = os.path.join(k.workdir, "holder.json")
        run = subprocess.run(
            [*k.krex, "run", "--", sys.executable, STAMP, "holder", hout, "20"],
            env=k.env,
            capture_output=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr.decode()[-4000:]
        sib.wait(120)
        rc = att.wait(120)
    finally:
        for p in (sib, att):
            if p.poll() is None:
                p.kill()
                p.wait()
    err = att.stderr.read() if att.stderr else ""
    lines.drain(5)
    holder = json.load(open(hout))["intervals"]
    sib_iv, att_iv = _load(sib_out), _load(att_out)
    assert sib_iv is not None and sib.returncode == 0, "the honest sibling was ended"
    ended = rc == UNPROTECTABLE
    row = {
        "scene": name,
        "attacker_rc": rc,
        "ended": ended,
        "attacker_kernels": len(att_iv or []),
        "attacker_overlaps": _overlaps(holder, att_iv or []),
        "sibling_kernels": len(sib_iv),
        "sibling_overlaps": _overlaps(holder, sib_iv),
        "said": [x for x in lines.lines if "refused" in x or "forging" in x],
        "stderr_tail": err[-600:],
    }
    print(json.dumps(row))
    _record(row)
    assert row["sibling_overlaps"] == 0
    if name in HONEST:
        assert not ended and rc == 0, err[-3000:]
    if not ended:
        assert att_iv is not None and len(att_iv) > 20, (rc, err[-3000:])
        assert row["attacker_overlaps"] == 0, row
    else:
        assert "krex:" in err, err[-3000:]  # krex run said why
    if name == "RTLD_DEEPBIND":
        said = next(x["refused"] for x in lines.lines if "refused" in x)
        assert all(s.startswith("refused") for s in said), said
        assert "RTLD_DEEPBIND" in err, err[-3000:]
