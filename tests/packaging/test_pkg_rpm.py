"""Smoke test of the .rpm: metadata, and an install with ``rpm --root``.

The scratch root has no shell or rpm database of a real RPM distribution,
so the install uses ``--nodeps`` (the Requires name Fedora/EL packages,
checked here by reading them) and ``--noscripts`` (the scriptlets call
systemctl/systemd-sysusers, which the scratch root does not have).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pkgtest_container as pc
import pytest

# as test_pkg_deb
pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.packages, pytest.mark.serial]


def rpm(*args: str) -> str:
    """Output of ``rpm ARGS`` (fails the test on a non-zero exit)."""
    res = subprocess.run(["rpm", *args], capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"rpm {args}: {res.stderr}"
    return res.stdout


def test_requires(packages: pc.Packages) -> None:
    requires = rpm("-qp", "--requires", str(packages.rpm))
    for dep in ("pyzmq", "msgpack", "psutil", "sdnotify"):
        assert f"dist({dep})" in requires, f"no Python requirement on {dep}:\n{requires}"
    assert "python(abi)" in requires or "python3 >= 3.11" in requires, requires
    assert "libc.so.6" in requires, f"shim's ELF dependencies not generated:\n{requires}"


def test_config_and_scripts(packages: pc.Packages) -> None:
    assert rpm("-qp", "--configfiles", str(packages.rpm)).split() == ["/etc/krex/krex.toml"]
    scripts = rpm("-qp", "--scripts", str(packages.rpm))
    assert "systemd-sysusers" in scripts
    assert "krexd.service" in scripts


def test_install_into_scratch_root(packages: pc.Packages, tmp_path: Path) -> None:
    root = tmp_path / "root"
    rpm("--root", str(root), "--initdb")
    rpm("--root", str(root), "-i", "--nodeps", "--noscripts", str(packages.rpm))
    assert rpm("--root", str(root), "-q", "krex").startswith("krex-")
    for cmd in ("krexd", "krex", "krexctl"):
        first = (root / "usr" / "bin" / cmd).read_text().splitlines()[0]
        assert first.startswith("#!/usr/bin/python3"), (cmd, first)
    for lib in ("libkrex_shim.so", "libkrex_gate.so"):
        head = (root / "usr" / "lib64" / "krex" / lib).read_bytes()[:4]
        assert head == b"\x7fELF", lib
    assert (root / "usr" / "lib" / "systemd" / "system" / "krexd.service").is_file()
    assert (root / "usr" / "lib" / "sysusers.d" / "krex.conf").is_file()
    sitelib = list(root.glob("usr/lib/python3.*/site-packages"))
    assert len(sitelib) == 1, sitelib
    for pkg in ("krexd", "krex_cli", "krex_client"):
        assert (sitelib[0] / pkg / "__init__.py").is_file(), pkg

    # %config(noreplace): an edited config survives removal as .rpmsave.
    config = root / "etc" / "krex" / "krex.toml"
    config.write_text(config.read_text() + "\n# edited by the admin\n")
    rpm("--root", str(root), "-e", "--noscripts", "krex")
    assert not (root / "usr" / "bin" / "krexd").exists()
    saved = root / "etc" / "krex" / "krex.toml.rpmsave"
    assert saved.is_file() and "edited by the admin" in saved.read_text()
