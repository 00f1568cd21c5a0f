"""Build hook of krex-client: ship ``krex_client-autoregion.pth`` at the top of the wheel.

A ``.pth`` file must sit directly in site-packages, which pyproject.toml's
package data cannot express; this ``build_py`` copies it next to the
package in the build directory, so wheels (and installs from them) carry it.
Everything else is in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "krex_client-autoregion.pth"


class BuildPyWithPth(build_py):
    """``build_py`` that also copies :data:`PTH` to the top of the build directory."""

    def run(self) -> None:
        """Build the package, then add the ``.pth`` file."""
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        self.copy_file(os.path.join(here, PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        """The package's files and the ``.pth`` file (so installers record it)."""
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
