"""Fixtures: the shim, the gate library and their test programs, built once.

``shim_build`` runs ``make -C libkrex_shim tests`` (the libraries into
``build/lib``, the C programs of ``tests/shim/c`` into ``build/shim-tests``)
and points :mod:`krexd.gate` at the freshly built gate library.
``gate`` is an open gate in the test's temporary directory.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from krexd.gate import Gate

from .procs import REPO, ShimBuild


@pytest.fixture(scope="session")
def shim_build() -> ShimBuild:
    """Build the shim, the gate library and the test programs (once per test run)."""
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "libkrex_shim"), "tests"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    b = ShimBuild()
    os.environ["KREX_GATE_LIB"] = str(b.gate_lib)
    return b


@pytest.fixture
def gate(shim_build: ShimBuild, tmp_path: Path) -> Iterator[Gate]:
    """A fresh gate for GPU 0 in this test's directory."""
    g = Gate.create(str(tmp_path / "gpu0.gate"), 0)
    yield g
    g.unmap()
