"""``[gpu] device_isolation``: a tenant's processes open their own GPU's node and no other.

Simulated GPUs have no device nodes, so the tests make real ones with
``mknod`` (character major 195, minors 0-2 and 255, as ``/dev/nvidia0-2`` and
``/dev/nvidiactl``) in a temporary directory.  No driver serves that major
here, so a node the cgroup allows fails to open with ``ENXIO`` (or
``ENODEV``), one it denies with ``EPERM``: the tests tell the two apart.
The processes probing are placed in real tenant and pool cgroups made by
krexd's own code (``CgroupBackend``), and by krexd itself through ``krex run``.
"""

from __future__ import annotations

import asyncio
import errno
import glob
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from krexd.cgroups import CgroupBackend, bpf, devices
from krexd.cgroups.detect import find_mounts
from krexd.config.config import CgroupConfig, ConfigError, CpuConfig
from krexd.hardware.inventory import fake_gpus
from krexd.hardware.slices import compute_slices
from tests.support import clean_env
from tests.support.krexd import REPO, Krexd, make_config, render_toml

pytestmark = pytest.mark.root

NODES = {"gpu0": 0, "gpu1": 1, "gpu2": 2, "ctl": 255}

# Waits for a line on stdin, then opens each path and prints {path: "ok" | errno name}.
# argv[1]: "self" (this process), "fork" (a forked child), "env-i" (a child exec'd
# with an empty environment, as `env -i` or subprocess.run(env={}) start it).
PROBE = r"""
import errno, json, os, subprocess, sys
how, paths = sys.argv[1], sys.argv[2:]
def probe():
    out = {}
    for p in paths:
        try:
            os.close(os.open(p, os.O_RDWR))
            out[p] = "ok"
        except OSError as e:
            out[p] = errno.errorcode[e.errno]
    return out
if how != "now":
    sys.stdin.readline()
if how in ("self", "now"):
    print(json.dumps(probe()), flush=True)
elif how == "fork":
    r, w = os.pipe()
    if os.fork() == 0:
        os.write(w, json.dumps(probe()).encode()); os._exit(0)
    os.close(w); os.wait(); print(os.read(r, 65536).decode(), flush=True)
else:
    code = "import runpy, sys; sys.argv = ['probe', 'self'] + sys.argv[1:]; " \
        "exec(open(%r).read())" % sys.argv[0]
    env_i = subprocess.run(["env", "-i", sys.executable, "-c", code, *paths], input=b"\n",
                           capture_output=True, check=True)
    print(env_i.stdout.decode().strip(), flush=True)
"""


@pytest.fixture
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Character nodes of major 195 (see the module docstring) and /dev/null, by name."""
    d = tmp_path_factory.mktemp("dev")
    out = {}
    for name, minor in NODES.items():
        path = str(d / name)
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(bpf.NVIDIA_MAJOR, minor))
        out[name] = path
    try:
        os.close(os.open(out["gpu0"], os.O_RDWR))
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.ENODEV):  # a nodev mount, or a real GPU
            pytest.skip(f"device nodes here open with {errno.errorcode[exc.errno]}")
    out["null"] = "/dev/null"
    (d / "probe.py").write_text(PROBE)
    out["probe"] = str(d / "probe.py")
    return out


@pytest.fixture
def backend() -> Iterator[Callable[[str], CgroupBackend]]:
    """Makes a krexd cgroup tree over 3 simulated GPUs with ``[gpu] device_isolation``."""
    made: list[CgroupBackend] = []

    def make(mode: str) -> CgroupBackend:
        cores = sorted(os.sched_getaffinity(0))
        slices = compute_slices(fake_gpus(3), CpuConfig(allow_shared=True), cores, {})
        name = f"krexdev{os.getpid()}n{len(made)}"
        made.append(CgroupBackend.open(CgroupConfig(name=name, pids_max=0)))
        made[-1].devices = devices.DeviceIsolation(mode, {0: 0, 1: 1, 2: 2})
        made[-1].prepare(slices)  # a refused start: teardown below cleans and unlocks
        return made[-1]

    yield make
    for b in made:
        asyncio.run(b.teardown())
        assert not os.path.exists(b.root)


def probe_in(add_pid: Callable[[int], None], nodes: dict[str, str], how: str) -> dict[str, str]:
    """Start the probe, place it with ``add_pid``, let it open every node; by node name."""
    names = ["gpu0", "gpu1", "gpu2", "ctl", "null"]
    p = subprocess.Popen(
        [sys.executable, nodes["probe"], how, *(nodes[n] for n in names)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        add_pid(p.pid)
        out, _ = p.communicate(b"\n", timeout=10)
    finally:
        p.kill()
    assert p.returncode == 0
    by_path = json.loads(out)
    return {n: by_path[nodes[n]] for n in names}


def not_denied(result: str) -> bool:
    return result in ("ENXIO", "ENODEV", "ok")


@pytest.mark.parametrize("how", ["self", "fork", "env-i"])
def test_a_tenant_opens_its_own_gpu_node_and_no_other(
    backend: Callable[[str], CgroupBackend], nodes: dict[str, str], how: str
) -> None:
    b = backend("require")
    assert b.devices.active, b.devices.reason
    cg = b.create_tenant(1, 7)
    got = probe_in(cg.add_pid, nodes, how)
    assert got["gpu0"] == "EPERM" and got["gpu2"] == "EPERM", got
    assert not_denied(got["gpu1"]) and not_denied(got["ctl"]), got
    assert got["null"] == "ok"
    assert len(bpf.attached(cg.path)) == 1
    asyncio.run(cg.wait_empty(5))
    cg.remove()


def test_a_pool_opens_no_gpu_node(
    backend: Callable[[str], CgroupBackend], nodes: dict[str, str]
) -> None:
    b = backend("auto")
    pools = b.pools(0)
    pools.prepare()
    pc = pools.create(os.getuid(), 1)
    got = probe_in(pc.add_pid, nodes, "self")
    assert [got[g] for g in ("gpu0", "gpu1", "gpu2")] == ["EPERM"] * 3, got
    assert not_denied(got["ctl"]) and got["null"] == "ok"
    assert pc.remove()


def test_removing_the_tenant_cgroup_frees_its_program(
    backend: Callable[[str], CgroupBackend],
) -> None:
    cg = backend("require").create_tenant(0, 1)
    (prog,) = bpf.attached(cg.path)
    assert bpf.program_exists(prog)
    cg.remove()
    deadline = time.monotonic() + 5  # the kernel releases a cgroup's programs from a worker
    while bpf.program_exists(prog):
        assert time.monotonic() < deadline, f"program {prog} outlived its cgroup"
        time.sleep(0.02)


def test_off_attaches_nothing(
    backend: Callable[[str], CgroupBackend], nodes: dict[str, str]
) -> None:
    b = backend("off")
    cg = b.create_tenant(1, 2)
    assert bpf.attached(cg.path) == []
    got = probe_in(cg.add_pid, nodes, "self")
    assert not_denied(got["gpu0"]), got
    assert b.describe()["devices"] == {
        "mode": "off",
        "active": False,
        "reason": "[gpu] device_isolation = off",
        "minors": {"0": 0, "1": 1, "2": 2},
    }
    asyncio.run(cg.wait_empty(5))
    cg.remove()


def _no_bpf(own_minor: int | None, *rules: object) -> int:
    raise bpf.BpfError(errno.EPERM, "loading the device program: Operation not permitted")


def test_require_without_bpf_is_a_clear_error_and_auto_goes_on(
    backend: Callable[[str], CgroupBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bpf, "load", _no_bpf)
    with pytest.raises(ConfigError, match=r"device_isolation = require, but .*not permitted"):
        backend("require")
    b = backend("auto")
    assert not b.devices.active and "not permitted" in b.devices.reason
    assert bpf.attached(b.create_tenant(0, 3).path) == []


def test_krexd_without_cap_bpf_refuses_to_start_under_require(
    tmp_path: Path,
) -> None:
    if shutil.which("capsh") is None:
        pytest.skip("no capsh")
    name = f"krexdevcap{os.getpid()}"
    conf = os.path.join(str(tmp_path), "krex.toml")
    tables = make_config(os.path.join(str(tmp_path), "s.sock"), name, 4)
    with open(conf, "w") as f:
        f.write(render_toml({**tables, "gpu": {"device_isolation": "require"}}))
    krexd = [sys.executable, "-m", "krexd", "--foreground", "--config", conf, "--fake-gpus", "1"]
    run = subprocess.run(
        ["capsh", "--drop=cap_bpf,cap_sys_admin", "--", "-c", shlex.join(krexd)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env=clean_env(),
    )
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == (
        "krexd: [gpu] device_isolation = require, but device isolation is unavailable: "
        "loading the device program: Operation not permitted"
    ), run.stderr
    v2 = find_mounts().v2
    assert v2 is not None
    assert not glob.glob(os.path.join(v2, "**", name), recursive=True)  # its tree removed


def test_krex_run_cannot_leave_its_gpu(
    krexd_factory: Callable[..., Krexd], nodes: dict[str, str]
) -> None:
    k = krexd_factory(fake_gpus=2, config={"gpu": {"device_isolation": "require"}})
    argv = [sys.executable, nodes["probe"], "now", nodes["gpu0"], nodes["gpu1"]]
    run = subprocess.run(
        [*k.krex, "run", "--gpu", "1", "--", *argv],
        env={**k.env, "CUDA_VISIBLE_DEVICES": "0"},
        capture_output=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr.decode()
    got = json.loads(run.stdout)
    assert got[nodes["gpu0"]] == "EPERM" and not_denied(got[nodes["gpu1"]]), got
    text = subprocess.run(
        [*k.krexctl, "status"], env=k.env, capture_output=True, text=True, check=True
    ).stdout
    assert "device isolation: active" in text and "gpu1 -> /dev/nvidia1" in text, text


@pytest.fixture
def render_nodes(nodes: dict[str, str]) -> dict[str, str]:
    """``nodes``, two render nodes (DRM major 226, minors 128 and 129, as
    ``/dev/dri/renderD128``/``129``) and a card node (minor 0, ``/dev/dri/card0``),
    which no driver serves here either."""
    d = os.path.dirname(nodes["gpu0"])
    out = dict(nodes)
    for name, minor in (("render128", 128), ("render129", 129), ("card0", 0)):
        path = os.path.join(d, name)
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(bpf.DRM_MAJOR, minor))
        out[name] = path
    try:
        os.close(os.open(out["render128"], os.O_RDWR))
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.ENODEV):  # a DRM driver here
            pytest.skip(f"render nodes here open with {errno.errorcode[exc.errno]}")
    return out


def test_an_amd_gpus_tenant_opens_its_render_node_only(
    krexd_factory: Callable[..., Krexd], render_nodes: dict[str, str]
) -> None:
    k = krexd_factory(
        fake_gpus=2,
        args=["--fake-vendor", "amd"],
        config={"gpu": {"device_isolation": "require"}},
    )
    names = ("render128", "render129", "card0", "gpu0", "ctl", "null")
    paths = [render_nodes[n] for n in names]
    argv = [sys.executable, render_nodes["probe"], "now", *paths]
    run = subprocess.run(
        [*k.krex, "run", "--gpu", "1", "--", *argv], env=k.env, capture_output=True, timeout=30
    )
    assert run.returncode == 0, run.stderr.decode()
    got = json.loads(run.stdout)
    assert not_denied(got[render_nodes["render129"]]), got  # simulated AMD GPU 1: renderD129
    assert got[render_nodes["render128"]] == "EPERM" and got[render_nodes["gpu0"]] == "EPERM"
    assert got[render_nodes["card0"]] == "EPERM"  # amdgpu takes work through card nodes too
    assert not_denied(got[render_nodes["ctl"]]) and got["/dev/null"] == "ok"
    text = subprocess.run(
        [*k.krexctl, "status"], env=k.env, capture_output=True, text=True, check=True
    ).stdout
    assert "gpu1 -> /dev/dri/renderD129" in text, text
