"""Fixtures of the fake HIP runtime's tests: ``fakehip_build`` (built once per
session, with the fake CUDA driver it links) and ``fh``, a private fake device
per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakecuda.harness import Build
from tests.support import make

from .harness import FakeHip, HipBuild


@pytest.fixture(scope="session")
def fakehip_build() -> HipBuild:
    """The fake HIP runtime and hipbench (and the fake CUDA driver), built once."""
    make("fakehip")
    return HipBuild.default()


@pytest.fixture
def fh(fakehip_build: HipBuild, tmp_path: Path) -> FakeHip:
    """A fake device whose timeline and memory state belong to this test only."""
    return FakeHip(Build.default(), tmp_path, fakehip_build)
