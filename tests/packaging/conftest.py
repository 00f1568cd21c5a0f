"""Fixtures of the packaging tests: tools installed, packages built once."""

from __future__ import annotations

import pytest
from pkgtest_container import Packages, ToolsUnavailable, build_packages, ensure_tools


@pytest.fixture(scope="session")
def packages() -> Packages:
    """The .deb and .rpm built from this tree by packaging/build.sh (lint included).

    Skips (with the reason) when the tools cannot be installed: not root,
    or no Debian mirror reachable.
    """
    try:
        ensure_tools()
    except ToolsUnavailable as exc:
        pytest.skip(f"packaging tools unavailable: {exc}")
    return build_packages()
