"""Files krexd and its clients open safely; the gate is readable by the socket group only.

Each fails on the krexd before: the gate file was 0644 whatever the socket group, a state
directory others may write was used, and a saved cgroup outside krexd's tree was adopted
(and its processes killed).
"""

from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable

import pytest

from krexd.restarts import saved_state
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def test_the_gate_is_readable_by_the_socket_group_only(krexd_factory: Factory) -> None:
    group = grp.getgrgid(65534).gr_name
    k = krexd_factory(config={"daemon": {"socket_group": group}})
    gate = k.status()["gpus"][0]["gate"]
    st = os.stat(gate)
    assert st.st_uid == 0 and st.st_gid == 65534, (st.st_uid, st.st_gid)
    assert stat.S_IMODE(st.st_mode) == 0o640, oct(st.st_mode)


def test_a_state_directory_others_may_write_is_refused(krexd_factory: Factory) -> None:
    """A misconfigured state directory (mode 0777) was used: any user could plant a state."""
    shared = tempfile.mkdtemp(prefix="krex-shared-")
    os.chmod(shared, 0o777)
    try:
        k = krexd_factory(config={"daemon": {"state_dir": shared}}, wait=False)
        rc = k.proc.wait(timeout=30)
        lines = [x for x in k.log().splitlines() if x.strip()]
        assert rc == 78, k.log()
        assert len(lines) == 1 and shared in lines[0] and "writable by every user" in lines[0]
    finally:
        shutil.rmtree(shared)


def test_a_saved_tenant_outside_krexds_tree_is_not_adopted(krexd_factory: Factory) -> None:
    """A planted state named a cgroup outside krexd's tree: krexd killed and removed it."""
    state_dir = tempfile.mkdtemp(prefix="krex-state-")
    os.chmod(state_dir, 0o755)
    name = f"krexsafe{os.getpid()}"
    first = krexd_factory(config={"daemon": {"state_dir": state_dir}}, name=name)
    root = first.status()["cgroups"]["root"]
    first.stop()
    victim = os.path.join(os.path.dirname(root), f"krexvictim{os.getpid()}")
    os.mkdir(victim)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with open(os.path.join(victim, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        tenant = {
            "id": 1, "token": "x", "gpu": 0, "argv": ["sleep"], "launcher_pid": 1,
            "launcher_start": 0, "uid": 0, "gid": 0, "exclusive": False, "without_mps": False,
            "cgroup": {"freezer": victim, "cpuset": None, "kind": "v2", "cores": [0]},
            "pids": [sleeper.pid], "state": "running", "kill_reason": None, "slots_fd": None,
            "memory": {},
        }  # fmt: skip
        doc = {"cgroup_root": root, "pid": 1, "saved_at": 0.0, "next_tenant_id": 2,
               "gpus": {"0": {"epoch": 1, "gate": None, "region": None, "exited": {}}},
               "tenants": [tenant]}  # fmt: skip
        saved_state.StateFile(saved_state.path_for(state_dir, name)).write(doc)
        k = krexd_factory(config={"daemon": {"state_dir": state_dir}}, name=name)
        assert "outside krexd's tree" in k.log()
        time.sleep(0.5)
        assert sleeper.poll() is None and os.path.isdir(victim)
        k.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
        os.rmdir(victim)
        shutil.rmtree(state_dir)
