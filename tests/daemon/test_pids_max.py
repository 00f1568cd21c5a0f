"""``[cgroup] pids_max``: a tenant that forks past its limit gets EAGAIN; others go on."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]

# Forks children (blocked on a pipe) until fork fails or 200 exist (a bound, so that a
# missing limit cannot turn this test into a fork bomb); writes "<forked> <errno>".
FORKER = """
import os, sys, time
marker, release = sys.argv[1], sys.argv[2]
r, w = os.pipe()
n, err = 0, 0
while n < 200:
    try:
        pid = os.fork()
    except OSError as exc:
        err = exc.errno
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    n += 1
with open(marker + ".tmp", "w") as f:
    f.write(f"{n} {err}")
os.rename(marker + ".tmp", marker)
while not os.path.exists(release):
    time.sleep(0.05)
os.close(w)
for _ in range(n):
    os.wait()
"""

# Forks ten children at once, all alive together, then reaps them.
SIBLING = """
import os, time
pids = []
for _ in range(10):
    pid = os.fork()
    if pid == 0:
        time.sleep(0.2)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print("forked", len(pids))
"""


def test_a_fork_bomb_is_held_to_its_own_tenant(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=1, config={"cgroup": {"pids_max": 16}})
    cg = k.status()["cgroups"]
    assert cg["pids"] in ("v2", "v1") and cg["pids_max"] == 16, cg
    marker, release = os.path.join(k.workdir, "forked"), os.path.join(k.workdir, "release")
    bomb = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, "-c", FORKER, marker, release], env=k.env
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(marker) and time.monotonic() < deadline:
            assert bomb.poll() is None, "the forking command ended early"
            time.sleep(0.05)
        with open(marker) as f:
            forked, err = (int(x) for x in f.read().split())
        assert err == errno.EAGAIN and 0 < forked < 16, (forked, err)
        # While the first tenant sits at its limit, a sibling forks freely.
        other = subprocess.run(
            [*k.krex, "run", "--", sys.executable, "-c", SIBLING],
            env=k.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode == 0 and "forked 10" in other.stdout, other.stderr
    finally:
        open(release, "w").close()
    assert bomb.wait(30) == 0
