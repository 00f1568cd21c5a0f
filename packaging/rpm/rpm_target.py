"""rpmbuild options for one RPM distribution of packaging/rpm/targets.toml.

``packaging/build.sh --rpm-target NAME`` builds the .rpm for distribution
NAME with these options: they set the target's interpreter (the commands'
shebang, ``%{python3}``), its X.Y and site directory, the package named by
``Requires``, the release suffix, and whether rpm generates the Python
module requirements (``pythonX.Ydist(...)``).

Usage::

    python3 rpm_target.py TARGETS NAME     # one rpmbuild argument a line
    python3 rpm_target.py TARGETS --list   # NAME, X.Y, distribution; one target a line

Exit status 0, 1 when the file cannot be read or NAME is not in it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

FIELDS = ("distribution", "python_version", "python_package", "interpreter", "dist", "python_deps")
PYTHON_DEPS = ("rpm", "pip")
_VERSION = re.compile(r"^3\.\d+$")


@dataclass(frozen=True)
class Target:
    """One RPM distribution and the Python the package runs on there."""

    name: str
    distribution: str
    python_version: str
    python_package: str
    interpreter: str
    dist: str
    python_deps: str

    @property
    def sitelib(self) -> str:
        """The site directory of ``python_version`` on the target (``%{python3_sitelib}``)."""
        return f"/usr/lib/python{self.python_version}/site-packages"

    @property
    def version_tuple(self) -> tuple[int, int]:
        """``python_version`` as (major, minor)."""
        major, minor = self.python_version.split(".")
        return (int(major), int(minor))

    def defines(self) -> dict[str, str]:
        """The rpm macros krex.spec reads, name to value."""
        return {
            "krex_rpm_target": self.name,
            "python3": self.interpreter,
            "python3_version": self.python_version,
            "python3_sitelib": self.sitelib,
            "krex_python_package": self.python_package,
            "krex_python_deps": self.python_deps,
            "dist": self.dist,
        }

    def rpmbuild_args(self) -> list[str]:
        """``defines()`` as rpmbuild arguments: ``--define``, ``"NAME VALUE"`` pairs."""
        args: list[str] = []
        for name, value in self.defines().items():
            args += ["--define", f"{name} {value}"]
        return args


def _target(name: str, table: object) -> Target:
    if not isinstance(table, dict):
        raise ValueError(f"[{name}] is not a table")
    missing = [f for f in FIELDS if not isinstance(table.get(f), str)]
    extra = sorted(set(table) - set(FIELDS))
    if missing or extra:
        raise ValueError(f"[{name}]: missing or non-string {missing}, unknown {extra}")
    target = Target(name=name, **{f: table[f] for f in FIELDS})
    if not _VERSION.match(target.python_version):
        raise ValueError(f"[{name}] python_version {target.python_version!r} is not 3.X")
    if not target.interpreter.startswith("/usr/bin/python3"):
        raise ValueError(f"[{name}] interpreter {target.interpreter!r} is not the system's")
    if target.python_deps not in PYTHON_DEPS:
        raise ValueError(f"[{name}] python_deps {target.python_deps!r} not in {PYTHON_DEPS}")
    return target


def load_targets(path: Path) -> dict[str, Target]:
    """Every target of the TOML file ``path``, by name.

    Raises ``OSError``, ``tomllib.TOMLDecodeError``, and ``ValueError`` for
    a table that lacks a field, has an unknown one, or a malformed value.
    """
    with path.open("rb") as f:
        data = tomllib.load(f)
    return {name: _target(name, table) for name, table in data.items()}


def main(argv: list[str]) -> int:
    """Print the rpmbuild arguments of ``argv[1]`` (or ``--list``) from file ``argv[0]``."""
    if len(argv) != 2:
        print("usage: rpm_target.py TARGETS (NAME | --list)", file=sys.stderr)
        return 1
    try:
        targets = load_targets(Path(argv[0]))
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"rpm_target: {argv[0]}: {exc}", file=sys.stderr)
        return 1
    if argv[1] == "--list":
        for t in targets.values():
            print(f"{t.name}\t{t.python_version}\t{t.distribution}")
        return 0
    target = targets.get(argv[1])
    if target is None:
        print(f"rpm_target: no target {argv[1]!r}; known: {', '.join(targets)}", file=sys.stderr)
        return 1
    print("\n".join(target.rpmbuild_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
