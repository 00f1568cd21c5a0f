"""Where krexd finds the shim and the gate library.

Search order (docs/design/interfaces.md "Build outputs"): environment
(``KREX_SHIM`` / ``KREX_GATE_LIB``), then the config's ``[shim] path``, then
``krexd/_lib/`` (installed wheel), then ``build/lib/`` of a source checkout,
then ``/usr/lib/<multiarch>/krex/`` (Debian) or ``%{_libdir}/krex/`` (rpm).  Each function
returns an existing absolute path or ``None``.
"""

from __future__ import annotations

import os
import platform
import sysconfig
from pathlib import Path

SHIM_NAME = "libkrex_shim.so"
GATE_NAME = "libkrex_gate.so"

_PKG_DIR = Path(__file__).resolve().parent.parent  # krexd/, above this room
_CHECKOUT = _PKG_DIR.parent


def _multiarch() -> str:
    arch = sysconfig.get_config_var("MULTIARCH")
    if isinstance(arch, str) and arch:
        return arch
    return f"{platform.machine()}-linux-gnu"


def _libdir() -> str:
    libdir = sysconfig.get_config_var("LIBDIR")
    if isinstance(libdir, str) and libdir.startswith("/usr"):
        return libdir
    return "/usr/lib64" if platform.architecture()[0] == "64bit" else "/usr/lib"


def _search(name: str, env: str, configured: str | None) -> str | None:
    candidates: list[str] = []
    if os.environ.get(env):
        candidates.append(os.environ[env])
    if configured:
        candidates.append(configured)
    candidates += [
        str(_PKG_DIR / "_lib" / name),
        str(_CHECKOUT / "build" / "lib" / name),
        f"/usr/lib/{_multiarch()}/krex/{name}",  # Debian: /usr/lib/<multiarch>/krex
        f"{_libdir()}/krex/{name}",  # rpm: %{_libdir}/krex (/usr/lib64/krex)
    ]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.abspath(c)
    return None


def shim_library(configured: str | None = None) -> str | None:
    """Path of ``libkrex_shim.so`` (``configured``: the config's ``[shim] path``)."""
    return _search(SHIM_NAME, "KREX_SHIM", configured)


def gate_library() -> str | None:
    """Path of ``libkrex_gate.so`` (gate protocol code krexd loads through ctypes)."""
    return _search(GATE_NAME, "KREX_GATE_LIB", None)
