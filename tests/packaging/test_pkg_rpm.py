"""Smoke test of the .rpm: metadata, and an install with ``rpm --root``.

packaging/build.sh builds it for its default target (el9, see
packaging/rpm/targets.toml): the Requires and the commands' shebangs must
name that distribution's interpreter. The scratch root has no shell or rpm
database of a real RPM distribution, so the install uses ``--nodeps`` (the
Requires name the distribution's packages, checked here by reading them) and
``--noscripts`` (the scriptlets call systemctl/systemd-sysusers, which the
scratch root does not have).
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pkgtest_container as pc
import pytest

TARGETS = pc.rpm_targets()
PYPROJECT = tomllib.loads((pc.REPO / "pyproject.toml").read_text())

# as test_pkg_deb
pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.packages, pytest.mark.serial]


def rpm(*args: str) -> str:
    """Output of ``rpm ARGS`` (fails the test on a non-zero exit)."""
    res = subprocess.run(["rpm", *args], capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"rpm {args}: {res.stderr}"
    return res.stdout


def built_target(packages: pc.Packages) -> Any:
    """The target (``rpm_target.Target``) the .rpm was built for, by its dist suffix."""
    release = rpm("-qp", "--qf", "%{RELEASE}", str(packages.rpm))
    found = [t for t in TARGETS.values() if release.endswith(t.dist)]
    assert len(found) == 1, (release, found)
    return found[0]


def test_requires(packages: pc.Packages) -> None:
    target = built_target(packages)
    requires = rpm("-qp", "--requires", str(packages.rpm)).splitlines()
    ver = target.python_version
    assert f"python(abi) = {ver}" in requires, requires
    assert target.interpreter in requires, f"shebang interpreter not required:\n{requires}"
    assert f"{target.python_package} >= 3.11" in requires, requires
    names = [d.split(">=")[0].strip() for d in PYPROJECT["project"]["dependencies"]]
    for dep in names:
        found = [r for r in requires if r.startswith(f"python{ver}dist({dep})")]
        if target.python_deps == "rpm":
            assert found, f"no Python requirement on {dep}:\n{requires}"
        else:
            assert not found, f"{target.name} does not package {dep} for python{ver}"
    assert not any("/usr/local" in r for r in requires), requires
    assert any(r.startswith("libc.so.6") for r in requires), "shim's ELF dependencies"


def test_config_and_scripts(packages: pc.Packages) -> None:
    assert rpm("-qp", "--configfiles", str(packages.rpm)).split() == ["/etc/krex/krex.toml"]
    scripts = rpm("-qp", "--scripts", str(packages.rpm))
    assert "systemd-sysusers" in scripts
    assert "krexd.service" in scripts


def test_install_into_scratch_root(packages: pc.Packages, tmp_path: Path) -> None:
    target = built_target(packages)
    root = tmp_path / "root"
    rpm("--root", str(root), "--initdb")
    rpm("--root", str(root), "-i", "--nodeps", "--noscripts", str(packages.rpm))
    assert rpm("--root", str(root), "-q", "krex").startswith("krex-")
    for cmd in ("krexd", "krex", "krexctl"):
        first = (root / "usr" / "bin" / cmd).read_text().splitlines()[0]
        assert first == f"#!{target.interpreter}", (cmd, first)
    for lib in ("libkrex_shim.so", "libkrex_gate.so"):
        head = (root / "usr" / "lib64" / "krex" / lib).read_bytes()[:4]
        assert head == b"\x7fELF", lib
    assert (root / "usr" / "lib" / "systemd" / "system" / "krexd.service").is_file()
    assert (root / "usr" / "lib" / "sysusers.d" / "krex.conf").is_file()
    sitelib = list(root.glob("usr/lib/python3.*/site-packages"))
    assert sitelib == [root / target.sitelib.lstrip("/")], sitelib
    tag = f"cpython-{target.python_version.replace('.', '')}"
    for pkg in ("krexd", "krex_cli", "krex_client"):
        assert (sitelib[0] / pkg / "__init__.py").is_file(), pkg
        # Byte code for the target's interpreter, and only for it.
        pycs = {p.name.split(".")[1] for p in (sitelib[0] / pkg).rglob("*.pyc")}
        assert pycs == {tag}, (pkg, pycs)

    # %config(noreplace): an edited config survives removal as .rpmsave.
    config = root / "etc" / "krex" / "krex.toml"
    config.write_text(config.read_text() + "\n# edited by the admin\n")
    rpm("--root", str(root), "-e", "--noscripts", "krex")
    assert not (root / "usr" / "bin" / "krexd").exists()
    saved = root / "etc" / "krex" / "krex.toml.rpmsave"
    assert saved.is_file() and "edited by the admin" in saved.read_text()
