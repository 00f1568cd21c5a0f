"""The README's first two commands work as written: as root without sudo, as a user with sudo.

``make -n`` shows what make would run: as root nothing goes through sudo (a
container has none); as another user the venv and the build stay that
user's and only the demo and the test suite run through sudo.
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


def make_dry_run(target: str, path: str, uid: int | None = None) -> list[str]:
    """The recipe lines ``make -n TARGET`` prints with ``PATH=path`` (as ``uid`` when given)."""
    env = {"PATH": path, "HOME": "/nonexistent"}
    argv = ["make", "-n", "-s", "-C", str(ROOT), target]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def step(lines: list[str], module: str) -> str:
    """The last recipe line running ``module``: for ``make test`` the suite after the
    fast lane (``make check``'s own pytest needs no root and is never escalated)."""
    found = [ln for ln in lines if f" -m {module}" in ln]
    assert found, f"no step runs {module}"
    return found[-1]


def test_readme_commands_are_make_demo_and_make_test() -> None:
    assert readme_try_it() == ["make demo", "make test"]


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
        (fake / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
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
    """``make -n demo|test`` as root and as nobody, with and without a ``sudo`` on PATH."""
    for target, module in (("demo", "krex_cli.demo"), ("test", "pytest")):
        # root, with or without sudo installed: nothing is escalated
        for path in (system_path, with_sudo):
            assert not step(make_dry_run(target, path), module).startswith("sudo ")
        # another user with sudo: only the step that starts krexd goes through sudo
        lines = make_dry_run(target, with_sudo, NOBODY)
        assert step(lines, module).startswith("sudo /")  # an absolute interpreter for sudo
        runs = [ln for ln in lines if f" -m {module}" in ln]
        escalated = [ln for ln in lines if ln.startswith("sudo")]
        # the suite's steps (for make test: after make check's own, never escalated)
        assert escalated and escalated == runs[len(runs) - len(escalated) :]
        assert module != "pytest" or not runs[0].startswith("sudo")
        # another user without sudo: runs unprivileged (the demo says it needs root)
        assert not step(make_dry_run(target, system_path, NOBODY), module).startswith("sudo")


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
