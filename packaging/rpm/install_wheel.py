"""Install a wheel into an RPM build root with an explicit file layout.

Used by krex.spec's %install where the Fedora/EL ``%pyproject_install`` macro
is not available (rpmbuild from Debian's ``rpm`` package, as in CI). The
interpreter's own install scheme cannot be used there: Debian's patched
``sysconfig`` points at ``/usr/local/.../dist-packages``, while an RPM must
put pure-Python code in ``%{python3_sitelib}`` (``/usr/lib/python3.X/site-packages``).

Usage::

    python3 install_wheel.py --destdir BUILDROOT --sitelib DIR --bindir DIR \
        --prefix DIR --interpreter /usr/bin/python3.12 \
        [--bytecompile-python PYTHON] WHEEL

Paths are absolute paths on the target system; files land under BUILDROOT.
``--interpreter`` is the target distribution's Python (the commands'
shebang). Byte code is compiled (optimization level 0, as Fedora's
byte-compilation step does) by ``--bytecompile-python``, an interpreter of
the target's X.Y on the build host (default: the running one): byte code is
only read by the X.Y that wrote it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.sources import WheelFile


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line; ``argv`` excludes the program name."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--destdir", required=True, help="RPM build root")
    parser.add_argument("--sitelib", required=True, help="target purelib/platlib directory")
    parser.add_argument("--bindir", required=True, help="target directory for commands")
    parser.add_argument("--prefix", default="/usr", help="target prefix for wheel data files")
    parser.add_argument("--interpreter", default="/usr/bin/python3", help="shebang interpreter")
    parser.add_argument(
        "--bytecompile-python",
        default=sys.executable,
        help="interpreter of the target's Python X.Y that compiles the byte code",
    )
    parser.add_argument("wheel", type=Path, help="the .whl file")
    return parser.parse_args(argv)


def install_wheel(
    wheel: Path,
    destdir: str,
    sitelib: str,
    bindir: str,
    prefix: str,
    interpreter: str,
    bytecompile_python: str = sys.executable,
) -> None:
    """Unpack ``wheel`` below ``destdir`` with the given target layout.

    ``sitelib``, ``bindir``, ``prefix``: absolute target paths (str).
    ``bytecompile_python`` compiles the byte code of everything below
    ``sitelib`` (its X.Y must be the target's). Raises ``FileNotFoundError``
    when the wheel does not exist, ``ValueError`` when a target path is
    relative and ``subprocess.CalledProcessError`` when compiling fails.
    """
    for name, value in (("sitelib", sitelib), ("bindir", bindir), ("prefix", prefix)):
        if not value.startswith("/"):
            raise ValueError(f"--{name} must be an absolute path, got {value!r}")
    if not wheel.is_file():
        raise FileNotFoundError(f"wheel not found: {wheel}")
    scheme = {
        "purelib": sitelib,
        "platlib": sitelib,
        "scripts": bindir,
        "data": prefix,
        "headers": f"{prefix}/include/python3/krex",
    }
    destination = SchemeDictionaryDestination(
        scheme,
        interpreter=interpreter,
        script_kind="posix",
        bytecode_optimization_levels=(),
        destdir=destdir,
    )
    with WheelFile.open(wheel) as source:
        install(source, destination, additional_metadata={"INSTALLER": b"rpm\n"})
    # The .pyc files record their path on the target system (-s strips the build root).
    root = Path(destdir)
    subprocess.run(
        [bytecompile_python, "-m", "compileall", "-q", "-o", "0", "-s", str(root), "-p", "/"]
        + [str(root / sitelib.lstrip("/"))],
        check=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        install_wheel(
            args.wheel,
            args.destdir,
            args.sitelib,
            args.bindir,
            args.prefix,
            args.interpreter,
            args.bytecompile_python,
        )
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"install_wheel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
