"""Every command of the README's and the docs' ``sh`` blocks works as written.

The blocks of README.md, python_client/README.md and docs/**/*.md are read line by
line (continuations joined, comments dropped; in a block showing ``$ `` prompts, only
those lines) and each command is checked the strongest way it can be here, without a
GPU and without changing the host, from the checkout's root as the docs assume:

* ``run``: run as written and must succeed: ``make venv all`` (the build
  ``make test`` has just done), ``python3 -m pytest tests/gpu ...`` (skipped
  without a GPU), ``krexctl status`` (exit 0, or 3: no krexd);
* ``parse``: krex's own programs (``krex``, ``krexctl``, ``krexd``,
  ``benchmarks/*.py``) parse the documented arguments with their own parser and
  stop there (tests/cli/parse_only.py): they need a GPU, a running krexd or many
  minutes;
* ``dry``: ``make TARGET`` whose recipe is the demo or the suite itself:
  ``make -n`` expands it (tests/cli/test_demo.py and the suite run them);
* ``script``: ``benchmarks/*.sh`` (GPU runs): present, executable, ``bash -n``;
* ``pip``: ``pip install`` of this checkout: the directory and each extra named
  exist (no install);
* ``NOT_RUN``: system administration, each program with the test that covers it.

``python3``/``python`` is this interpreter (the docs' commands run in the checkout's
``.venv`` or on a host with the packages).  A command of a new program fails here
until it is given a way to be checked or a reason in ``NOT_RUN``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARSE_ONLY = Path(__file__).resolve().parent / "parse_only.py"
DOCS = [ROOT / "README.md", ROOT / "python_client" / "README.md"]
DOCS += sorted(ROOT.glob("docs/**/*.md"))
OWN = {
    "krex": "krex_cli.main:main",
    "krexctl": "krex_cli.krexctl:main",
    "krexd": "krexd.cli.krexd:main",
}
RUN_MAKE = {"venv", "all"}
#: Programs not run, each with why and what covers it instead.
NOT_RUN = {
    "apt": "installs on the host; the tested install runs apt-get install of the .deb in a "
    "booted Debian root (tests/packaging/test_pkg_deb.py, make test-packages)",
    "dnf": "no dnf on the Debian CI host; the .rpm is installed with rpm --root "
    "(tests/packaging/test_pkg_rpm.py)",
    "zypper": "no zypper on the Debian CI host; the .rpm is installed with rpm --root "
    "(tests/packaging/test_pkg_rpm.py)",
    "systemctl": "needs systemd as PID 1; the tested install boots one (test_pkg_deb.py)",
    "journalctl": "needs krexd's journal under systemd; test_pkg_deb.py reads it",
    "usermod": "changes the host's users; the tested install adds a member of krex",
    "useradd": "changes the host's users; the tested install adds a member of krex",
    "curl": "needs krexd with [metrics] on; tests/metrics/test_endpoint.py scrapes it",
    "ray": "a Ray cluster of GPU hosts; tests/cluster/test_ray_cluster.py starts one",
    "venv": "`python3 -m venv /opt/...` makes a directory outside the checkout",
}


@dataclass(frozen=True)
class Command:
    """One documented command: where it is, its words (``sudo`` and ``VAR=`` dropped)."""

    where: str
    words: tuple[str, ...]
    text: str


def block_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, command line) of the ``sh`` blocks of ``path``, continuations joined;
    a block that is a usage synopsis (``[--option]``) is left out (test_readme_commands.py
    checks it against the parsers)."""
    text = path.read_text(encoding="utf-8")
    out: list[tuple[int, str]] = []
    for m in re.finditer(r"^( *)```sh\n(.*?)^\1```", text, re.S | re.M):
        first = text[: m.start()].count("\n") + 2
        body = m.group(2)
        if " [--" in body:
            continue
        lines = [(first + i, ln.strip()) for i, ln in enumerate(body.splitlines())]
        if any(ln.startswith("$ ") for _, ln in lines):
            lines = [(n, ln[2:]) for n, ln in lines if ln.startswith("$ ")]
        joined: list[tuple[int, str]] = []
        for n, ln in lines:
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + ln)
            else:
                joined.append((n, ln))
        out += [(n, ln) for n, ln in joined if ln and not ln.startswith("#")]
    return out


def documented() -> list[Command]:
    """Every documented command."""
    found = []
    for path in DOCS:
        for line, text in block_lines(path):
            words = shlex.split(text, comments=True)
            while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
                words = words[1:]
            if words and words[-1] == "&":
                words = words[:-1]
            found.append(Command(f"{path.relative_to(ROOT)}:{line}", tuple(words), text))
    return found


def how(cmd: Command) -> str:
    """How ``cmd`` is checked: run, parse, dry, script, pip, or a NOT_RUN key."""
    prog, args = Path(cmd.words[0]).name, cmd.words[1:]
    if prog == "make":
        return "run" if set(args) <= RUN_MAKE else "dry"
    if prog in OWN:
        return "run" if list(args) == ["status"] and prog == "krexctl" else "parse"
    if prog.startswith("python"):
        if args[:2] == ("-m", "pytest"):
            return "run"
        if args[:2] == ("-m", "pip"):
            return "pip"
        return "venv" if args[:2] == ("-m", "venv") else "parse"
    if prog.endswith(".sh"):
        return "script"
    if prog == "pip":
        return "pip"
    assert prog in NOT_RUN, f"{cmd.where}: `{cmd.text}`: no way to check {prog}: add one"
    return prog


def run(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``argv`` from the checkout's root, this interpreter first on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def check(cmd: Command) -> None:
    """Check one command (see the module docstring); fail with its output."""
    kind, words = how(cmd), list(cmd.words)
    prog = Path(words[0]).name
    if prog.startswith("python") and kind in ("run", "parse"):
        words[0] = sys.executable
    if kind == "run":
        p = run(words)
        ok = {0, 3} if prog == "krexctl" else {0}
        assert p.returncode in ok, p.stdout[-3000:] + p.stderr[-3000:]
    elif kind == "parse":
        target = OWN[prog] if prog in OWN else words[1]
        rest = words[1:] if prog in OWN else words[2:]
        p = run([sys.executable, str(PARSE_ONLY), target, *rest], timeout=60)
        assert p.returncode == 0 and "PARSED" in p.stderr, p.stderr[-3000:]
    elif kind == "dry":
        p = run(["make", "-n", "AS_ROOT=sudo", *words[1:]])  # as a user who may use sudo
        assert p.returncode == 0, p.stderr
    elif kind == "script":
        script = ROOT / words[0]
        assert script.is_file() and os.access(script, os.X_OK), script
        assert run(["bash", "-n", str(script)]).returncode == 0
    elif kind == "pip":
        check_pip(words[2:] if prog.startswith("python") else words)  # python -m pip
    else:
        pytest.skip(NOT_RUN[kind])


def check_pip(words: list[str]) -> None:
    """A ``pip install`` of a local project: its directory and extras exist."""
    for req in (w for w in words[2:] if not w.startswith("-")):
        local = re.fullmatch(r"(\.[^\[]*)(?:\[([\w,]+)\])?", req)
        if local is None:
            assert not req.startswith("krex"), f"{req}: the docs install krex from a checkout path"
            continue
        project = ROOT / local.group(1)
        meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        extras = set(meta.get("optional-dependencies", {}))
        wanted = set(filter(None, (local.group(2) or "").split(",")))
        assert wanted <= extras, f"{req}: no extra {wanted - extras} in {project}"


COMMANDS = documented()
pytestmark = pytest.mark.slow


def test_every_block_is_read() -> None:
    assert len(COMMANDS) >= 60
    kinds = [how(c) for c in COMMANDS]
    assert {"run", "parse", "dry", "script", "pip"} <= set(kinds)
    assert sum(k in NOT_RUN for k in kinds) <= len(kinds) // 3, "most commands are checked"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_documented_command(cmd: Command) -> None:
    check(cmd)
