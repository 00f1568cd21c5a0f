"""The README's first two commands work as written: as root without sudo, as a user with
sudo, as a user without it.

``make -n`` shows what make would run: as root nothing goes through sudo (a
container has none); as another user the venv and the build stay that
user's, only the demo, the test suite's root part and the package tests run
through sudo, and what they leave in the checkout is handed back; without
sudo, a target that cannot work says so in one line first.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from krex_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def readme_try_it() -> list[str]:
    """The commands of the README's "Try it" block (comments stripped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Try it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "no sh block under 'Try it'"
    return [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines() if ln.strip()]


def make_run(target: str, path: str, uid: int | None = None) -> subprocess.CompletedProcess[str]:
    """``make -n -s TARGET`` with ``PATH=path`` (as ``uid`` when given)."""
    env = {"PATH": path, "HOME": "/nonexistent"}
    argv = ["make", "-n", "-s", "--no-print-directory", "-C", str(ROOT), target]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def make_dry_run(target: str, path: str, uid: int | None = None) -> list[str]:
    """The recipe lines ``make -n TARGET`` prints with ``PATH=path`` (as ``uid`` when given)."""
    p = make_run(target, path, uid)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def step(lines: list[str], module: str) -> str:
    """The last recipe line running ``module``: for ``make test`` the suite after the
    fast lane (``make check``'s own pytest needs no root and is never escalated)."""
    found = [ln for ln in lines if f" -m {module}" in ln]
    assert found, f"no step runs {module}"
    return found[-1]


def command(line: str) -> str:
    """A recipe line without the traps of a root step (which hand its files back)."""
    return line.rsplit("trap 'exit 130' INT TERM; ", 1)[-1].strip()


def escalates(line: str) -> bool:
    """True when a recipe line runs something through sudo."""
    return "sudo env " in line or "sudo find " in line


#: The README's commands and the others that run a step as root: (target, module it runs).
ROOT_TARGETS = (
    ("demo", "krex_cli.demo"),
    ("test", "pytest"),
    ("test-packages", "pytest"),
    ("ci", "pytest"),
)


def test_readme_commands_are_make_demo_and_make_ci() -> None:
    assert readme_try_it() == ["make demo", "make ci"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == "make ci", "CI runs exactly the README's test command"


def test_sudo_make_by_the_checkouts_owner_is_refused_in_one_line() -> None:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "SUDO_UID": str(ROOT.stat().st_uid),
        "SUDO_USER": "alice",
    }
    for target in ("demo", "test", "ci"):
        p = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), target],
            env=env,
            capture_output=True,
            text=True,
        )
        assert p.returncode != 0 and p.stdout == ""
        assert "run make as alice, without sudo" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    clean = subprocess.run(["make", "-n", "-C", str(ROOT), "clean"], env=env, capture_output=True)
    assert clean.returncode == 0
    # Inside make test's own root step (sudo from the owner's make), the tests run make to
    # build what they need: that make is the owner's, not a `sudo make`.
    step = {**env, "KREX_ROOT_STEP": "1"}
    for target in ("fakecuda", "demo"):
        p = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), target],
            env=step,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0 and "without sudo" not in p.stderr, p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (and setpriv to become another user)")
def test_make_escalates_only_where_needed_and_available() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv")
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    if subprocess.run([*as_nobody, "test", "-r", str(ROOT / "Makefile")]).returncode != 0:
        pytest.skip("this checkout is not readable by other users")
    fake = Path(tempfile.mkdtemp(prefix="krex-sudo-"))  # outside pytest's root-only tmp
    try:
        fake.chmod(0o755)
        no_sudo = without_sudo(fake / "bin")
        (fake / "sudo").write_text('#!/bin/sh\n[ "$1" != -n ] || shift\nexec "$@"\n')
        (fake / "sudo").chmod(0o755)
        check_make(str(no_sudo), f"{fake}:{no_sudo}")
    finally:
        shutil.rmtree(fake)


def without_sudo(directory: Path, system_path: str = "/usr/local/bin:/usr/bin:/bin") -> Path:
    """A PATH directory holding the system's commands but ``sudo`` (links to them), so that
    "a user without sudo" is one on a machine where sudo is installed too."""
    directory.mkdir(mode=0o755)
    for d in system_path.split(":"):
        for entry in Path(d).iterdir() if Path(d).is_dir() else ():
            link = directory / entry.name
            if entry.name != "sudo" and not link.exists() and os.access(entry, os.X_OK):
                link.symlink_to(entry)
    return directory


def check_make(system_path: str, with_sudo: str) -> None:
    """``make -n`` of the targets with a root step, as root and as nobody, with and without
    a ``sudo`` on PATH."""
    for target, module in ROOT_TARGETS:
        # root, with or without sudo installed: nothing is escalated
        for path in (system_path, with_sudo):
            assert not any(map(escalates, make_dry_run(target, path))), target
        # another user with sudo: only the steps that need root go through sudo, with
        # an absolute interpreter, and what they leave in the checkout is handed back
        lines = make_dry_run(target, with_sudo, NOBODY)
        runs = [ln for ln in lines if f" -m {module}" in ln]
        escalated = [ln for ln in lines if escalates(ln)]
        assert escalated and escalated == runs[len(runs) - len(escalated) :], target
        for ln in escalated:
            # bytecode to build/pycache (root's, handed back below), none beside the sources
            assert command(ln).startswith("sudo env -u PYTHONDONTWRITEBYTECODE "), ln
            assert f"PYTHONPYCACHEPREFIX={ROOT}/build/pycache " in command(ln), ln
            assert command(ln).split(" -m ")[0].split()[-1].startswith("/"), ln
            assert "sudo find . -xdev" in ln and "-user 0 -exec chown -h" in ln, ln
        if target in ("test", "ci"):
            assert not escalates(runs[0])  # make check's pytest: never escalated
        # another user without sudo: the targets that cannot work say so in one line and
        # do nothing; the test suite says first that it skips the tests that need root
        if target == "test":
            lines = make_dry_run(target, system_path, NOBODY)
            assert not any(map(escalates, lines)) and "no sudo" in lines[0], lines[:2]
        else:
            p = make_run(target, system_path, NOBODY)
            assert p.returncode != 0 and p.stdout == "", p.stdout
            assert len(p.stderr.splitlines()) == 1 and "as root" in p.stderr, p.stderr


def readme_using_it() -> str:
    """The README's "Using it" usage block."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Using it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "no sh block under 'Using it'"
    return block.group(1)


def test_readme_usage_lists_every_krex_run_option_and_the_config_search_order() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = {
        opt
        for action in sub.choices["run"]._actions
        for opt in action.option_strings
        if opt.startswith("--") and opt != "--help"
    }
    usage = readme_using_it()
    run_usage = usage[usage.index("krex run") : usage.index("krexctl")]
    assert {o for o in options if o not in run_usage} == set()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for where in ("$KREX_CONFIG", "/etc/krex/krex.toml", "etc/krex.toml"):
        assert where in text.split("## Using it", 1)[1], where
