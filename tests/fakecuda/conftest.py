"""Fixtures: the built fake driver, and a private fake device per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import Build, FakeCuda, build


@pytest.fixture(scope="session")
def fakecuda_build() -> Build:
    """The fake driver and its programs, built once per test session."""
    return build()


@pytest.fixture
def fc(fakecuda_build: Build, tmp_path: Path) -> FakeCuda:
    """A fake device whose timeline and memory state belong to this test only."""
    return FakeCuda(fakecuda_build, tmp_path)
