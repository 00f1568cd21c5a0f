"""Tested install of the .deb under a real systemd (systemd-nspawn -b).

One module-scoped container run: build the packages, install the .deb with
apt into a clean Debian 12 root (Depends fetched from the mirror), boot it
with systemd as PID 1 and let container/checks.py observe the service. Each
test below reports one of those observations.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pkgtest_container as pc
import pytest

# serial: one process builds the packages and the OS image once for both files.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.packages,
    pytest.mark.timeout(1500),
    pytest.mark.serial,
]


@dataclass(frozen=True)
class Booted:
    """What one container run left: results of checks.py and logs."""

    root: Path
    apt_log: str
    console: str
    results: dict[str, dict[str, object]]


@pytest.fixture(scope="module")
def booted(packages: pc.Packages) -> Iterator[Booted]:
    """Install the .deb in a clean root and boot it once for all checks.

    The unpacked root (about 400 MB) is removed afterwards unless
    KREX_PKGTEST_KEEP=1; the base tarball stays cached in build/pkgtest/.
    """
    try:
        tarball = pc.base_tarball()
        root = pc.prepare_root(tarball)
        apt_log = pc.install_deb(root, packages.deb)
    except pc.ToolsUnavailable as exc:
        pytest.skip(f"no clean Debian root: {exc}")
    pc.stage_checks(root, fake_gpus=1)
    console = pc.boot(root)
    yield Booted(root, apt_log, console, pc.read_results(root))
    if os.environ.get("KREX_PKGTEST_KEEP") != "1":
        shutil.rmtree(root, ignore_errors=True)


def expect(booted: Booted, name: str) -> None:
    """Fail with the detail and the container's journal unless check ``name`` passed."""
    result = booted.results.get(name)
    if result is None:
        pytest.fail(
            f"check {name} did not run; results {booted.results}\n"
            f"console:\n{booted.console[-4000:]}\njournal:\n{pc.container_journal(booted.root)}"
        )
    if not result["ok"]:
        pytest.fail(f"{name}: {result['detail']}\njournal:\n{pc.container_journal(booted.root)}")


def test_depends_resolved_by_apt(booted: Booted) -> None:
    # apt pulled the Python dependencies from the mirror: the base root has none.
    for dep in ("python3-zmq", "python3-msgpack", "python3-psutil", "python3-sdnotify"):
        assert f"Setting up {dep}" in booted.apt_log, f"{dep} not installed by apt"
    assert "Setting up krex " in booted.apt_log


def test_service_active_via_notify(booted: Booted) -> None:
    expect(booted, "service_active_via_notify")


def test_watchdog_pings(booted: Booted) -> None:
    expect(booted, "watchdog_pings")


def test_installed_unit_verifies(booted: Booted) -> None:
    expect(booted, "unit_verify")


def test_krexd_in_leaf_cgroup(booted: Booted) -> None:
    expect(booted, "krexd_in_leaf_cgroup")


def test_socket_group_only(booted: Booted) -> None:
    expect(booted, "socket_permissions")


def test_krexctl_status(booted: Booted) -> None:
    expect(booted, "krexctl_status")


def test_system_python_imports_client(booted: Booted) -> None:
    expect(booted, "system_python_imports")


def test_region_freezes_and_thaws_sibling(booted: Booted) -> None:
    expect(booted, "region_freezes_and_thaws_sibling")


def test_journal_fields_select_a_tenants_records(booted: Booted) -> None:
    expect(booted, "journal_fields")


def test_restart_keeps_commands(booted: Booted) -> None:
    # Issue "Restarts" item 9: `systemctl restart` while a command runs.
    expect(booted, "restart_keeps_commands")


def test_reinstall_keeps_commands(booted: Booted) -> None:
    # A package reinstall (the upgrade path) while a command runs.
    expect(booted, "reinstall_keeps_commands")


def test_watchdog_restart_keeps_commands(booted: Booted) -> None:
    # Item 8: a hung event loop is killed by systemd's watchdog; the new krexd adopts.
    expect(booted, "watchdog_restart_keeps_commands")


def test_stop_leaves_no_process(booted: Booted) -> None:
    expect(booted, "stop_leaves_no_process")


def test_remove_keeps_config(booted: Booted) -> None:
    expect(booted, "remove_keeps_config")


def test_purge_removes_config(booted: Booted) -> None:
    expect(booted, "purge_removes_config")
