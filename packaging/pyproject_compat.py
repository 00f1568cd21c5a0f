"""Make pyproject.toml buildable with a distribution's older setuptools.

pyproject.toml states its license as a PEP 639 SPDX string
(``license = "Apache-2.0"``), which setuptools accepts from version 77 on.
Debian 12 ships setuptools 66 and EL9 ships 53: they reject the string and
accept only the older table form ``license = { text = "Apache-2.0" }``,
which says the same thing. The distribution builds (packaging/deb/rules,
packaging/rpm/krex.spec) run this on their copy of the source tree before
building the wheel; with setuptools >= 77 it changes nothing.

Usage: ``python3 pyproject_compat.py PYPROJECT``. Exit status 0 (rewritten
or nothing to do), 1 when the file cannot be read or rewritten.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PEP639_SETUPTOOLS = (77, 0)
_LICENSE_LINE = re.compile(r'^(license\s*=\s*)"([^"]*)"\s*$', re.MULTILINE)


def setuptools_version() -> tuple[int, int]:
    """(major, minor) of the installed setuptools; (0, 0) when not installed."""
    try:
        m = re.match(r"(\d+)(?:\.(\d+))?", version("setuptools"))
    except PackageNotFoundError:
        return (0, 0)
    if m is None:
        return (0, 0)
    return (int(m.group(1)), int(m.group(2) or 0))


def rewrite(text: str) -> str:
    """``text`` with a PEP 639 ``license = "X"`` in [project] turned into ``{ text = "X" }``.

    Raises ``ValueError`` when the license string is in the TOML but not on
    a line of its own that can be rewritten.
    """
    project = tomllib.loads(text).get("project", {})
    if not isinstance(project.get("license"), str):
        return text
    new, count = _LICENSE_LINE.subn(r'\1{ text = "\2" }', text)
    if count != 1:
        raise ValueError('license string found by TOML but not as one `license = "..."` line')
    return new


def main(argv: list[str]) -> int:
    """Rewrite the pyproject.toml named in ``argv[0]`` when setuptools needs it."""
    if len(argv) != 1:
        print("usage: pyproject_compat.py PYPROJECT", file=sys.stderr)
        return 1
    if setuptools_version() >= PEP639_SETUPTOOLS:
        return 0
    path = Path(argv[0])
    try:
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
            print(f"pyproject_compat: {path}: license string -> table (old setuptools)")
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"pyproject_compat: {path}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
