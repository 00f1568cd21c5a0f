"""The RPM targets (packaging/rpm/targets.toml) and the Python minimum (fast checks).

Each target's spec is rendered with ``rpmspec -P`` (no build): it must name
that distribution's interpreter in Requires and shebang. The minimum Python
the shipped code needs is measured with vermin and must be the one
pyproject.toml's requires-python and docs/install.md state, and no target's
interpreter may be older. The built package is checked in test_pkg_rpm.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib

import pytest
from pkgtest_container import REPO, SYSTEM_PATH, rpm_targets

TARGETS = rpm_targets()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The code shipped in the packages (krexd, krex_cli, krex_client) and the build helpers.
SHIPPED = [REPO / "krexd", REPO / "krex_cli", REPO / "python_client" / "krex_client"]


def documented_minimum() -> tuple[int, int]:
    """The X.Y of pyproject.toml's ``requires-python = ">=X.Y"``."""
    m = re.fullmatch(r">=\s*3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert m, PYPROJECT["project"]["requires-python"]
    return (3, int(m.group(1)))


def test_code_minimum_is_the_documented_one() -> None:
    """vermin's minimum for the shipped code equals requires-python."""
    vermin = pytest.importorskip("vermin")
    config = vermin.Config()
    need: dict[tuple[int, int], list[str]] = {}
    files = [p for root in SHIPPED for p in sorted(root.rglob("*.py"))]
    files += sorted((REPO / "packaging").rglob("*.py"))
    for path in files:
        mins = vermin.detect(path.read_text(), config, str(path))
        assert isinstance(mins, list), f"vermin cannot parse {path}"
        v3 = mins[1]
        assert v3 is not None and v3 != 0, f"{path}: not Python 3 ({mins})"
        need.setdefault((v3[0], v3[1]), []).append(str(path.relative_to(REPO)))
    code_min = max(need)
    assert code_min == documented_minimum(), (
        f"code needs {code_min} (files: {need[code_min][:5]}), "
        f"pyproject.toml says {PYPROJECT['project']['requires-python']}"
    )
    x, y = code_min
    install = (REPO / "docs" / "install.md").read_text()
    assert f"Python {x}.{y} or newer" in install, "docs/install.md states another minimum"
    spec = (REPO / "packaging" / "rpm" / "krex.spec").read_text()
    assert f"%global krex_python_min {x}.{y}\n" in spec


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_target_python_is_new_enough(name: str) -> None:
    """Every target's interpreter meets requires-python."""
    assert TARGETS[name].version_tuple >= documented_minimum()


@pytest.fixture(scope="module")
def rpmspec() -> str:
    """Path of rpmspec (Debian's rpm package); skips when it is missing."""
    found = shutil.which("rpmspec", path=SYSTEM_PATH)
    if found is None:
        pytest.skip("rpmspec missing (packaging/install-build-deps.sh installs it)")
    return found


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_spec_renders_for_target(rpmspec: str, name: str) -> None:
    """The spec, rendered for a target, names its interpreter, package and paths."""
    t = TARGETS[name]
    res = subprocess.run(
        [rpmspec, "-P", *t.rpmbuild_args(), "--define", "krex_build_python /usr/bin/python3"]
        + [str(REPO / "packaging" / "rpm" / "krex.spec")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    text = res.stdout
    lines: dict[str, list[str]] = {}
    for tag, _, value in (line.partition(":") for line in text.splitlines()):
        lines.setdefault(tag, []).append(value.strip())
    assert f"{t.python_package} >= 3.{documented_minimum()[1]}" in lines["Requires"], text
    assert f"{t.python_package}-devel >= 3.{documented_minimum()[1]}" in lines["BuildRequires"]
    assert lines["Release"] == [f"1{t.dist}"]
    assert f"--interpreter {t.interpreter} " in text
    assert f"--sitelib {t.sitelib} " in text
    assert "/usr/local" not in t.interpreter + t.sitelib


def test_unknown_target_fails() -> None:
    """build.sh's helper refuses a target it does not know, naming those it knows."""
    res = subprocess.run(
        [sys.executable, str(REPO / "packaging" / "rpm" / "rpm_target.py")]
        + [str(REPO / "packaging" / "rpm" / "targets.toml"), "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 1
    assert "el9" in res.stderr


def test_pip_targets_documented() -> None:
    """install.md's pip line for targets without packaged modules lists every dependency."""
    install = (REPO / "docs" / "install.md").read_text()
    pip_lines = [line for line in install.splitlines() if "-m pip install" in line]
    for t in TARGETS.values():
        if t.python_deps != "pip":
            continue
        lines = [x for x in pip_lines if f"python{t.python_version} -m pip install" in x]
        deps = [f"'{dep}'" for dep in PYPROJECT["project"]["dependencies"]]
        assert any(all(dep in x for dep in deps) for x in lines), (
            f"{t.name}: no `python{t.python_version} -m pip install` line with {deps}: {lines}"
        )
