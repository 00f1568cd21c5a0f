"""A real krexd: start, serve, socket permissions, refusals at start, clean shutdown."""

from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from krex_client.connection import Connection, RemoteError
from tests.support import wait_for
from tests.support.krexd import REPO, Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def test_ping_and_status(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=2, slots=3)
    ping = k.request("ping")
    assert ping["pid"] == k.pid and ping["version"] == "0.1.0" and ping["uptime_s"] >= 0
    st = k.status()
    assert [g["index"] for g in st["gpus"]] == [0, 1]
    assert all(g["fake"] and g["slots_total"] == 3 and g["slots_used"] == 0 for g in st["gpus"])
    assert st["cgroups"]["backend"] in ("v2", "hybrid")
    assert st["state"] == "running" and st["tenants"] == [] and st["queue"]["parked"] == 0
    for g in st["gpus"]:
        assert os.path.isdir(os.path.join(st["cgroups"]["root"], f"gpu{g['index']}"))
    # ping and status change nothing: no state save was made for them.
    assert st["server"]["requests"] >= 2 and st["server"]["state_save_ms"]["n"] == 0


def test_socket_mode_is_exact_under_any_umask(krexd_factory: Factory) -> None:
    old = os.umask(0)  # krexd inherits it; the socket must still be 0660
    try:
        k = krexd_factory()
    finally:
        os.umask(old)
    st = os.stat(k.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660


def test_socket_group_and_mode_from_config(krexd_factory: Factory) -> None:
    group = "nogroup"
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        group, gid = grp.getgrgid(0).gr_name, 0
    k = krexd_factory(config={"daemon": {"socket_group": group, "socket_mode": "0640"}})
    st = os.stat(k.socket)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == gid


def test_unknown_socket_group_is_refused(krexd_factory: Factory) -> None:
    k = krexd_factory(config={"daemon": {"socket_group": "no-such-group-krex"}}, wait=False)
    assert k.proc.wait(20) == 69
    assert "no-such-group-krex" in k.log()


def test_sigterm_removes_socket_and_cgroups(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=2)
    dirs = list(k.cgroup_dirs)
    assert dirs and all(os.path.isdir(d) for d in dirs)
    assert k.stop() == 0
    assert not any(os.path.exists(d) for d in dirs)


def test_bad_config_is_refused_naming_the_key(krexd_factory: Factory) -> None:
    k = krexd_factory(config={"admission": {"slot_per_gpu": 2}}, wait=False)
    assert k.proc.wait(20) == 78
    assert "[admission] slot_per_gpu: unknown key" in k.log()


def test_invalid_slices_are_refused(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=2, config={"cpu": {"slices": {0: "0", 1: "0-999"}}}, wait=False)
    assert k.proc.wait(20) == 78
    assert "do not exist" in k.log()


def test_krex_socket_in_the_environment_overrides_the_config(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    alt = str(tmp_path / "env.sock")
    k = krexd_factory(env={"KREX_SOCKET": alt}, wait=False)
    k.socket = alt
    k.wait_ready()
    assert k.status()["socket"] == alt
    assert not os.path.exists(os.path.join(k.workdir, "krexd.sock"))


def test_second_krexd_on_the_same_socket_is_refused(krexd_factory: Factory) -> None:
    k = krexd_factory()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "krexd",
            "--foreground",
            "--fake-gpus",
            "1",
            "--config",
            os.path.join(k.workdir, "krex.toml"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 69 and "another krexd" in p.stderr
    assert k.request("ping")["pid"] == k.pid


def test_unknown_op_and_bad_fields_get_errors(krexd_factory: Factory) -> None:
    k = krexd_factory()
    with Connection(k.socket) as c:
        with pytest.raises(RemoteError) as info:
            c.request("launch_missiles")
        assert info.value.name == "UNKNOWN_OP" and "launch_missiles" in info.value.message
        with pytest.raises(RemoteError) as info:
            c.request("admit", {"argv": "not a list", "launcher_pid": os.getpid()})
        assert info.value.name == "BAD_FIELD" and "argv" in info.value.message
        with pytest.raises(RemoteError) as info:
            c.request("ping", {"extra": 1})
        assert info.value.name == "BAD_FIELD"
        with pytest.raises(RemoteError) as info:
            c.request("admit", {"argv": ["x"], "launcher_pid": os.getpid(), "gpu": 9})
        assert info.value.name == "NO_SUCH_GPU"
        assert c.request("ping")["pid"] == k.pid


def test_restart_after_crash_thaws_and_cleans(krexd_factory: Factory) -> None:
    k = krexd_factory()
    # k2 below has its own socket and state directory (nothing to adopt); krex run
    # would wait KREX_RECONNECT_S for a krexd on k's socket to confirm the end.
    run = subprocess.Popen(
        [*k.krex, "run", "--", "sleep", "60"],
        env=dict(k.env, KREX_RECONNECT_S="1"),
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: bool(k.status()["tenants"]) and k.status()["tenants"][0]["pid"] is not None)
    t = k.status()["tenants"][0]
    with open(os.path.join(t["cgroup"], "cgroup.freeze"), "w") as f:
        f.write("1")
    k.proc.kill()  # a crash: krexd cleans up nothing
    k.proc.wait()
    assert os.path.isdir(t["cgroup"])
    k2 = krexd_factory(name=k.cgroup_name)
    # The frozen tenant of the dead krexd was thawed and killed, its cgroup removed.
    assert run.wait(20) == 128 + 9
    assert not os.path.exists(t["cgroup"])
    assert k2.status()["tenants"] == []
    k.cgroup_dirs = []  # k2 owns (and will remove) the tree now


@pytest.mark.root
def test_second_krexd_with_the_same_cgroup_name_leaves_the_first_alone(
    krexd_factory: Any,
) -> None:
    """A second krexd must not take a live krexd's cgroup tree for a stale one."""
    first = krexd_factory(slots=2)
    tenant = subprocess.Popen(
        [*first.krex, "run", "--", sys.executable, "-c", "import time; time.sleep(60)"],
        env=first.env,
    )
    try:
        deadline = time.monotonic() + 20
        while not first.status()["tenants"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = krexd_factory(slots=2, name=first.cgroup_name, wait=False)
        assert second.proc.wait(20) != 0
        assert "in use by another krexd" in second.log()
        assert tenant.poll() is None, "the second krexd killed the first one's tenant"
        assert len(first.status()["tenants"]) == 1
    finally:
        tenant.terminate()
        tenant.wait(20)


@pytest.mark.root
def test_gate_files_are_krexds_alone(krexd_factory: Any) -> None:
    """The gate is root's, readable by all, writable by krexd alone, whatever the socket's mode.

    Tenants map it read-only (the shim refuses a gate others may write); a
    second link in a root-only directory lets krexd restore its path.
    """
    k = krexd_factory(config={"daemon": {"socket_mode": "0640"}})
    gate = k.status()["gpus"][0]["gate"]
    assert gate and os.path.basename(gate) == f"{k.cgroup_name}-gpu0.gate"
    st = os.stat(gate)
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == 0 and st.st_nlink == 2
    keep = os.path.join(os.path.dirname(gate), ".krex-keep")
    assert stat.S_IMODE(os.stat(keep).st_mode) == 0o700
