"""The systemd units and sysusers file as shipped in systemd/ (fast checks).

``systemd-analyze verify`` and ``security --offline`` need no running
systemd; the full check of the installed unit under systemd as PID 1 is in
test_pkg_deb.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pkgtest_container import REPO, SYSTEM_PATH

from tests.support import INSTALL_ENV, installs_allowed

UNITS = REPO / "systemd"
# Recorded in docs/packaging.md; raise it only with a reason written there.
MAX_EXPOSURE = 3.5


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    """Path of systemd-analyze, installing the build tools when it is missing."""
    found = shutil.which("systemd-analyze", path=SYSTEM_PATH)
    if found is None and not installs_allowed():
        pytest.skip(f"systemd-analyze missing; make test-packages installs it ({INSTALL_ENV}=1)")
    if found is None:
        res = subprocess.run([str(REPO / "packaging" / "install-build-deps.sh")], check=False)
        found = shutil.which("systemd-analyze", path=SYSTEM_PATH)
        if found is None:
            pytest.skip(f"systemd-analyze missing and cannot be installed (rc={res.returncode})")
    return found


def test_units_verify(systemd_analyze: str, tmp_path: Path) -> None:
    # verify insists that ExecStart's program exists; /usr/bin/krexd only does
    # once the package is installed, so point it at an existing program and
    # keep every other line as shipped.
    service = (UNITS / "krexd.service").read_text()
    assert "\nExecStart=/usr/bin/krexd " in service
    (tmp_path / "krexd.service").write_text(
        service.replace("\nExecStart=/usr/bin/krexd ", "\nExecStart=/bin/true ")
    )
    shutil.copy2(UNITS / "krex.slice", tmp_path / "krex.slice")
    res = subprocess.run(
        [systemd_analyze, "verify", "--man=no", "krexd.service", "krex.slice"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    # Unknown keys and bad values are warnings on stderr with rc 0.
    assert res.stderr.strip() == "", res.stderr


def test_security_exposure(systemd_analyze: str) -> None:
    res = subprocess.run(
        [
            systemd_analyze,
            "security",
            "--no-pager",
            "--offline=yes",
            f"--threshold={MAX_EXPOSURE * 10:.0f}",
            str(UNITS / "krexd.service"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"Overall exposure level for krexd\.service: (\d+\.\d)", res.stdout)
    assert m, res.stdout + res.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, res.stdout
    assert res.returncode == 0, res.stderr


def test_unit_contract() -> None:
    """The properties the daemon and the docs rely on are set, each once."""
    keys: dict[str, list[str]] = {}
    for line in (UNITS / "krexd.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            keys.setdefault(k, []).append(v)
    expect = {
        "Type": "notify",
        "NotifyAccess": "main",
        "Restart": "on-failure",
        "Delegate": "yes",
        "RuntimeDirectory": "krex",
        "Group": "krex",
        "Slice": "krex.slice",
        # Restarts keep the commands (containerd's model); krexd ends them on a stop.
        "KillMode": "process",
        "RuntimeDirectoryPreserve": "restart",
    }
    for k, v in expect.items():
        assert keys.get(k) == [v], (k, keys.get(k))
    assert keys.get("WatchdogSec") and keys["WatchdogSec"][0] != "0"
    # ExecStop tells a restart from a stop (krexd --prepare-restart only for a restart job).
    (stop,) = keys["ExecStop"]
    assert "list-jobs" in stop and "--prepare-restart" in stop
    # Hardening that would break cgroup management or GPU access stays off.
    for forbidden in ("ProtectControlGroups", "PrivateDevices", "DevicePolicy", "IPAddressDeny"):
        assert forbidden not in keys, forbidden


def test_ray_worker_unit(systemd_analyze: str, tmp_path: Path) -> None:
    """krex-ray-worker.service verifies, starts Ray through krex ray-resources, and never
    stops with krexd (a krexd restart keeps the commands) nor isolates resources."""
    unit = (UNITS / "krex-ray-worker.service").read_text()
    keys: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            keys.setdefault(k, []).append(v)
    (start,) = keys["ExecStart"]
    assert start.startswith("/usr/bin/krex ray-resources --exec -- ray start --block ")
    assert not any("resource-isolation" in v for vs in keys.values() for v in vs)
    assert keys["Environment"] == ["KREX_SOCKET=/run/krex/krexd.sock"]
    assert keys["SupplementaryGroups"] == ["krex"] and keys["KillMode"] == ["control-group"]
    assert "krexd.service" in keys["Wants"][0] and "krexd.service" in keys["After"][0]
    for forbidden in ("Requires", "BindsTo", "PartOf"):
        assert forbidden not in keys, forbidden
    (tmp_path / "krex-ray-worker.service").write_text(
        unit.replace("\nExecStart=/usr/bin/krex ", "\nExecStart=/bin/true ")
    )
    res = subprocess.run(
        [systemd_analyze, "verify", "--man=no", "krex-ray-worker.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr


def test_sysusers_creates_group(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers", path=SYSTEM_PATH)
    if sysusers is None:
        pytest.skip("systemd-sysusers not installed")
    (tmp_path / "etc").mkdir()
    res = subprocess.run(
        [sysusers, f"--root={tmp_path}", str(UNITS / "krex-sysusers.conf")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    groups = (tmp_path / "etc" / "group").read_text().splitlines()
    krex = [g for g in groups if g.startswith("krex:")]
    assert len(krex) == 1, groups
    gid = int(krex[0].split(":")[2])
    assert 0 < gid < 1000, f"krex should be a system group, got gid {gid}"


def test_versions_agree() -> None:
    """pyproject.toml, debian/changelog and the spec name one version."""
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    changelog = (REPO / "packaging" / "deb" / "changelog").read_text().splitlines()[0]
    assert changelog.startswith(f"krex ({version}-"), changelog
    spec = (REPO / "packaging" / "rpm" / "krex.spec").read_text()
    assert re.search(rf"^Version:\s+{re.escape(version)}$", spec, re.M), "spec Version"
