"""Host side of the tested install: build, clean Debian root, install, boot.

The steps of tests/packaging/test_pkg_deb.py, each a function so a failure
names its step:

1. :func:`ensure_tools` installs the build and test tools
   (packaging/install-build-deps.sh --test) or says why it cannot.
2. :func:`build_packages` runs packaging/build.sh (build/pkg/*.deb, *.rpm).
3. :func:`base_tarball` makes a minimal Debian 12 root with systemd
   (mmdebstrap), cached as a tarball under build/pkgtest/.
4. :func:`prepare_root` unpacks it; :func:`install_deb` installs the .deb
   with apt inside it (``systemd-nspawn`` without boot, host network), so
   the package's Depends are resolved from the mirror as on a real host.
5. :func:`stage_checks` adds the test driver unit and a drop-in that gives
   krexd one fake GPU; :func:`boot` runs ``systemd-nspawn -b`` (systemd as
   PID 1, private network) until the driver powers the container off.
6. :func:`read_results` returns what tests/packaging/container/checks.py
   observed inside.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import INSTALL_ENV, installs_allowed

REPO = Path(__file__).resolve().parents[2]
CONTAINER_DIR = Path(__file__).resolve().parent / "container"
PKG_DIR = REPO / "build" / "pkg"
TEST_DIR = REPO / "build" / "pkgtest"
SUITE = "bookworm"
# Packages of the base root besides minbase: systemd as init, D-Bus for a
# normal system. Everything krex needs must come from its Depends.
BASE_INCLUDE = ("systemd", "systemd-sysv", "dbus")
BASE_MAX_AGE_S = 7 * 24 * 3600.0
HOST_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class ToolsUnavailable(RuntimeError):
    """Build or test tools cannot be installed, or no mirror is reachable."""


class StepFailed(RuntimeError):
    """A step of the tested install failed; the message holds its output."""


@dataclass(frozen=True)
class Packages:
    """The built packages (absolute paths)."""

    deb: Path
    rpm: Path


def rpm_targets() -> dict[str, Any]:
    """The RPM targets of packaging/rpm/targets.toml (``rpm_target.Target``), by name.

    packaging/rpm/rpm_target.py is loaded from its path: packaging/ is no package.
    """
    module = sys.modules.get("rpm_target")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "rpm_target", REPO / "packaging" / "rpm" / "rpm_target.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["rpm_target"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    targets: dict[str, Any] = module.load_targets(REPO / "packaging" / "rpm" / "targets.toml")
    return targets


def _env() -> dict[str, str]:
    """The host tools' environment: the system's PATH, and no bytecode settings of the
    checkout's test steps (they would move the image's and the packages' bytecode)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")
    }
    return {**env, "PATH": SYSTEM_PATH, "LC_ALL": "C.UTF-8"}


def _run(argv: list[str], step: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a host command of ``step``; raise :class:`StepFailed` with its output on failure."""
    try:
        res = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"{step}: timed out after {timeout} s: {argv}") from exc
    if res.returncode != 0:
        raise StepFailed(f"{step}: rc={res.returncode}\n{res.stdout[-4000:]}{res.stderr[-4000:]}")
    return res


def mirror_unreachable(output: str) -> bool:
    """True when apt's or mmdebstrap's ``output`` says the mirror could not be reached."""
    markers = (
        "Failed to fetch",
        "Could not resolve",
        "Temporary failure",
        "Unable to connect",
        "Could not connect",
        "Connection failed",
        "Network is unreachable",
    )
    return any(m in output for m in markers)


def ensure_tools() -> None:
    """Install what the build and the tested install need (idempotent).

    Raises :class:`ToolsUnavailable` when not root, or when apt cannot
    install them (no mirror reachable).
    """
    if os.geteuid() != 0:
        raise ToolsUnavailable("needs root (apt, mmdebstrap, systemd-nspawn)")
    if not installs_allowed():
        raise ToolsUnavailable(f"installs with apt: run by make test-packages ({INSTALL_ENV}=1)")
    res = subprocess.run(
        [str(REPO / "packaging" / "install-build-deps.sh"), "--test"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
        check=False,
    )
    if res.returncode == 2:
        raise ToolsUnavailable(res.stderr.strip() or "install-build-deps.sh could not install")
    if res.returncode != 0:
        raise StepFailed(f"install-build-deps.sh rc={res.returncode}: {res.stderr}")


def build_packages() -> Packages:
    """Run packaging/build.sh; the .deb and .rpm it made (lint included)."""
    _run([str(REPO / "packaging" / "build.sh"), "--no-install-deps"], "build.sh", 900)
    debs = sorted(PKG_DIR.glob("krex_*.deb"))
    rpms = sorted(p for p in PKG_DIR.glob("krex-*.rpm") if ".src." not in p.name)
    if len(debs) != 1 or len(rpms) != 1:
        raise StepFailed(f"build.sh made {debs} and {rpms}, expected one of each")
    return Packages(deb=debs[0], rpm=rpms[0])


def base_tarball() -> Path:
    """A minimal Debian root with systemd (mmdebstrap), cached under build/pkgtest/.

    Rebuilt when older than a week. Raises :class:`ToolsUnavailable` when
    mmdebstrap cannot fetch from the mirror.
    """
    TEST_DIR.mkdir(parents=True, exist_ok=True)
    tarball = TEST_DIR / f"{SUITE}-{'-'.join(BASE_INCLUDE)}.tar"
    if tarball.is_file() and time.time() - tarball.stat().st_mtime < BASE_MAX_AGE_S:
        return tarball
    partial = tarball.with_suffix(".partial.tar")
    argv = [
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        f"--include={','.join(BASE_INCLUDE)}",
        SUITE,
        str(partial),
    ]
    # The host's own Debian sources when it has them; mmdebstrap's default otherwise.
    if HOST_SOURCES.is_file():
        argv.append(str(HOST_SOURCES))
    res = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=_env()
    )
    if res.returncode != 0:
        partial.unlink(missing_ok=True)
        if mirror_unreachable(res.stdout + res.stderr):
            raise ToolsUnavailable(f"mmdebstrap cannot fetch: {res.stderr[-2000:]}")
        raise StepFailed(f"mmdebstrap rc={res.returncode}: {res.stderr[-4000:]}")
    partial.rename(tarball)
    return tarball


def prepare_root(tarball: Path) -> Path:
    """Unpack ``tarball`` into a fresh build/pkgtest/root; its path."""
    root = TEST_DIR / "root"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    _run(
        [
            "tar",
            "-C",
            str(root),
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=*",
            "-xf",
            str(tarball),
        ],
        "unpack base root",
        300,
    )
    # Persistent journal: the host reads it after the container stopped.
    (root / "var" / "log" / "journal").mkdir(parents=True, exist_ok=True)
    return root


def nspawn(*args: str) -> list[str]:
    """argv running ``systemd-nspawn ARGS`` on a host whose PID 1 is not systemd.

    ``--register=no --keep-unit``: no machined and no scope to ask the (absent)
    system bus for. nspawn keeps per-container state in
    /run/systemd/nspawn and refuses to clean it up unless it is a tmpfs,
    which /run is not on such hosts: give it a private tmpfs there, in a
    mount namespace of its own so the host sees nothing.
    """
    setup = (
        "mkdir -p /run/systemd/nspawn && "
        "mount -t tmpfs -o mode=0755 tmpfs /run/systemd/nspawn && "
        'exec "$@"'
    )
    return [
        "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", setup, "sh",
        "systemd-nspawn", "--quiet", "--register=no", "--keep-unit", *args,
    ]  # fmt: skip


def nspawn_run(root: Path, argv: list[str], step: str, timeout: float = 600) -> str:
    """Run ``argv`` in ``root`` (no boot, host network); its output."""
    res = _run(
        nspawn("--pipe", "-D", str(root), "--setenv=DEBIAN_FRONTEND=noninteractive", *argv),
        step,
        timeout,
    )
    return res.stdout + res.stderr


def install_deb(root: Path, deb: Path) -> str:
    """Install ``deb`` in ``root`` with apt, which fetches its Depends; apt's output."""
    shutil.copy2(deb, root / "root" / deb.name)
    try:
        nspawn_run(root, ["apt-get", "update", "-qq"], "apt-get update in the root")
    except StepFailed as exc:
        if mirror_unreachable(str(exc)):
            raise ToolsUnavailable(f"no Debian mirror reachable from the root: {exc}") from exc
        raise
    return nspawn_run(
        root,
        ["apt-get", "install", "-y", "--no-install-recommends", f"/root/{deb.name}"],
        "apt-get install of the .deb",
    )


def host_is_hybrid() -> bool:
    """True when this host mounts a cgroup v1 cpuset hierarchy (hybrid cgroups)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        _, _, right = line.partition(" - ")
        fields = right.split()
        if len(fields) >= 3 and fields[0] == "cgroup" and "cpuset" in fields[2].split(","):
            return True
    return False


def stage_checks(root: Path, fake_gpus: int = 1) -> None:
    """Copy the checks into the root, enable their unit, adapt krexd to this host.

    The drop-in gives krexd what the test host lacks: a GPU (--fake-gpus) and
    time (a 4 s watchdog period, so pings show within seconds). On a hybrid
    host, systemd-nspawn mounts the v1 controller hierarchies read-only in
    the container, so krexd runs there with a copy of the shipped config that
    selects the v2 backend (freezer in cgroup2, CPU slices by affinity).
    """
    dest = root / "opt" / "krex-pkgtest"
    shutil.copytree(CONTAINER_DIR, dest, dirs_exist_ok=True)
    etc = root / "etc" / "systemd" / "system"
    shutil.copy2(CONTAINER_DIR / "krex-pkgtest.service", etc / "krex-pkgtest.service")
    wants = etc / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "krex-pkgtest.service"
    link.unlink(missing_ok=True)
    link.symlink_to("/etc/systemd/system/krex-pkgtest.service")
    config = "/etc/krex/krex.toml"
    if host_is_hybrid():
        shipped = (root / "etc" / "krex" / "krex.toml").read_text()
        if '\nbackend = "auto"\n' not in shipped:
            raise StepFailed('shipped krex.toml has no `backend = "auto"` line to adapt')
        (dest / "krex.toml").write_text(
            shipped.replace('\nbackend = "auto"\n', '\nbackend = "v2"\n')
        )
        config = "/opt/krex-pkgtest/krex.toml"
    dropin = etc / "krexd.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "pkgtest.conf").write_text(
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart=/usr/bin/krexd --foreground --config {config}"
        f" --socket /run/krex/krexd.sock --fake-gpus {fake_gpus}\n"
        "WatchdogSec=4s\n"
    )


def boot(root: Path, timeout: float = 300) -> str:
    """Boot ``root`` with systemd as PID 1 until it powers off; the console output.

    Raises :class:`StepFailed` when the container does not power off in time.
    """
    argv = nspawn("--private-network", "-D", str(root), "--boot")
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        proc.terminate()  # nspawn asks the container's systemd to power off
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        raise StepFailed(f"container did not power off within {timeout} s:\n{out[-6000:]}") from exc
    return out


def read_results(root: Path) -> dict[str, dict[str, object]]:
    """Results written by checks.py (check name -> {"ok", "detail"}); {} if none."""
    path = root / "var" / "lib" / "krex-pkgtest" / "results.json"
    if not path.is_file():
        return {}
    data: dict[str, dict[str, object]] = json.loads(path.read_text())
    return data


def container_journal(root: Path) -> str:
    """The container's journal (krexd and the test driver), for failure messages."""
    res = subprocess.run(
        [
            "journalctl",
            "--no-pager",
            "-o",
            "short-monotonic",
            "-D",
            str(root / "var" / "log" / "journal"),
            "-u",
            "krexd.service",
            "-u",
            "krex-pkgtest.service",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    return res.stdout[-8000:] + res.stderr[-2000:]
