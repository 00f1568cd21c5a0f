"""The programs of krex_cli stay out of the daemon, and what both sides share stays small.

krex_cli imports the client library (krex_client) and outside libraries only,
never ``krexd``; names both sides need (error and exit codes, sizes, co-tenant
texts) have one home in krex_client, importable without pyzmq, msgpack or a GPU.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import krex_cli
import krexd
from krex_client.errors import COTENANT_TEXT, Code, ExitCode, StatusExit
from krexd.gate import COTENANT_REASONS

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "krex_cli"
CLIENT = ROOT / "python_client" / "krex_client"
SHARED = ("errors.py", "sizes.py")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, nested and type-only ones included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, "." * node.level + (node.module or "")))
            else:
                found.append((node.lineno, node.module or ""))
    return found


def daemon_imports(path: Path) -> list[str]:
    """``file:line module`` for each import of krexd in ``path``.

    Relative imports count too: krex_cli uses absolute ones, and a relative one
    could climb out of the package.
    """
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [
        f"{where}:{line} {mod}"
        for line, mod in imported_modules(path)
        if mod == "krexd" or mod.startswith(("krexd.", "."))
    ]


def test_the_checker_sees_every_kind_of_daemon_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    bad = pkg / "bad.py"
    bad.write_text(
        "import os\n"
        "import krexd.hardware.inventory\n"
        "from krexd import paths\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from krexd.daemon import Daemon\n"
        "def f() -> None:\n"
        "    from .. import krexd\n"
        "import krexdish\n"
    )
    assert [hit.split(" ")[1] for hit in daemon_imports(bad)] == [
        "krexd.hardware.inventory",
        "krexd",
        "krexd.daemon",
        "..",
    ]


def test_no_module_of_krex_cli_imports_krexd() -> None:
    files = sorted(CLI.rglob("*.py"))
    assert len(files) >= 10, files  # the walk found the package
    hits = [hit for f in files for hit in daemon_imports(f)]
    assert not hits, "krex_cli must use krex_client, not krexd:\n" + "\n".join(hits)


def test_loading_every_program_loads_no_daemon_module() -> None:
    modules = [
        "krex_cli." + str(f.relative_to(CLI).with_suffix("")).replace("/", ".")
        for f in sorted(CLI.rglob("*.py"))
        if f.name != "__main__.py"
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m.removesuffix('.__init__'))\n"
        "print(sorted(m for m in sys.modules if m == 'krexd' or m.startswith('krexd.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_shared_modules_need_only_the_standard_library() -> None:
    for name in SHARED:
        outside = [
            mod
            for _, mod in imported_modules(CLIENT / name)
            if mod.split(".")[0] not in sys.stdlib_module_names and mod != "__future__"
        ]
        assert not outside, f"krex_client/{name} imports {outside}"
    code = (
        "import sys, krex_client.errors, krex_client.sizes\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted({'zmq', 'msgpack', 'torch', 'krexd'} & loaded))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_krexd_uses_the_one_definition_of_the_codes() -> None:
    import krexd.system.errors

    assert krexd.system.errors.Code is Code
    assert krexd.system.errors.ExitCode is ExitCode
    assert krexd.system.errors.StatusExit is StatusExit


def test_every_cotenant_reason_of_the_shim_has_its_text() -> None:
    assert set(COTENANT_TEXT) == set(COTENANT_REASONS)


def test_programs_and_daemon_report_one_version() -> None:
    assert krex_cli.__version__ == krexd.__version__
