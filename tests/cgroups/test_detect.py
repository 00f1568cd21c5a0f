"""Backend detection from mountinfo and the cgroup root's controllers (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from krexd.cgroups import CgroupBackend
from krexd.cgroups.detect import Mounts, find_mounts, own_v1_cgroup, own_v2_cgroup
from krexd.config.config import CgroupConfig, ConfigError

PURE_V2 = "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
HYBRID = (
    "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    "42 31 0:39 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
)
MEMORY_V1 = "43 31 0:40 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"


def test_find_mounts(tmp_path: Path) -> None:
    (tmp_path / "a").write_text(PURE_V2)
    (tmp_path / "b").write_text(HYBRID)
    assert find_mounts(str(tmp_path / "a")) == Mounts("/sys/fs/cgroup", None)
    assert find_mounts(str(tmp_path / "b")) == Mounts(
        "/sys/fs/cgroup/unified", "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/pids"
    )

    (tmp_path / "c").write_text(HYBRID + MEMORY_V1)
    assert find_mounts(str(tmp_path / "c")).v1_memory == "/sys/fs/cgroup/memory"


def test_own_cgroup(tmp_path: Path) -> None:
    (tmp_path / "cg").write_text("1:name=systemd:/x\n0::/system.slice/krexd.service\n")
    assert own_v2_cgroup(str(tmp_path / "cg")) == "/system.slice/krexd.service"
    (tmp_path / "v1").write_text("4:memory:/pa/x\n3:cpu,cpuacct:/y\n0::/\n")
    assert own_v1_cgroup("memory", str(tmp_path / "v1")) == "/pa/x"
    assert own_v1_cgroup("cpuacct", str(tmp_path / "v1")) == "/y"
    assert own_v1_cgroup("pids", str(tmp_path / "v1")) == "/"


def fake_root(tmp_path: Path, controllers: str) -> str:
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / "cgroup.controllers").write_text(controllers + "\n")
    return str(tmp_path)


def test_pure_v2_with_cpuset(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "cpuset cpu io memory pids")
    b = CgroupBackend.open(CgroupConfig(name="k", root=root), Mounts(root, None))
    assert (b.kind, b.cpuset_kind, b.root) == ("v2", "v2", f"{root}/k")


def test_hybrid_when_v2_has_no_cpuset(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "")
    b = CgroupBackend.open(CgroupConfig(name="k", root=root), Mounts(root, "/cs"))
    assert (b.kind, b.cpuset_kind, b.cpuset_root) == ("hybrid", "v1", "/cs/k")


def test_affinity_without_any_cpuset(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "memory")
    b = CgroupBackend.open(CgroupConfig(name="k", root=root), Mounts(root, None))
    assert (b.kind, b.cpuset_kind) == ("v2", "affinity")


def test_forced_hybrid_needs_v1_cpuset(tmp_path: Path) -> None:
    root = fake_root(tmp_path, "")
    with pytest.raises(ConfigError, match="no v1 cpuset"):
        CgroupBackend.open(CgroupConfig(backend="hybrid", root=root), Mounts(root, None))


def test_no_cgroup2_is_refused() -> None:
    with pytest.raises(ConfigError, match="no cgroup2 mount"):
        CgroupBackend.open(CgroupConfig(), Mounts(None, "/cs"))


def test_root_must_be_a_cgroup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a cgroup2 directory"):
        CgroupBackend.open(CgroupConfig(root=str(tmp_path)), Mounts(str(tmp_path), None))


@pytest.mark.root
def test_read_only_v1_cpuset_falls_back_to_affinity(tmp_path: Path) -> None:
    """A v1 cpuset tree mounted read-only (nspawn on a hybrid host) cannot hold slices."""
    import subprocess

    root = fake_root(tmp_path, "cpu memory")
    ro = tmp_path / "ro-cpuset"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], check=True)
    try:
        b = CgroupBackend.open(CgroupConfig(name="k", root=root), Mounts(root, str(ro)))
        assert (b.kind, b.cpuset_kind) == ("v2", "affinity")
        forced = CgroupBackend.open(
            CgroupConfig(name="k", root=root, backend="hybrid"), Mounts(root, str(ro))
        )
        assert forced.kind == "hybrid"  # asked for explicitly: krexd will report the error
    finally:
        subprocess.run(["umount", str(ro)], check=True)
