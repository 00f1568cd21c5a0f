"""Fixtures for restart tests: a krexd that can be SIGKILLed and started again on its config."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.support import clean_env
from tests.support.krexd import REPO, Krexd

Factory = Callable[..., Krexd]


def driver_env(k: Krexd) -> dict[str, str]:
    """The fake driver ``krexd_factory`` gives krexd: a restarted one locks (and unlocks)
    the GPU's processes through the same simulated device, as the unit's restart keeps
    its environment."""
    env = {"KREX_FAKE_STATE": os.path.join(k.workdir, "fakestate")}
    fake_lib = os.path.join(REPO, "build", "fakecuda", "libcuda.so.1")
    if os.path.exists(fake_lib):
        env["KREX_DRIVER_LIB"] = fake_lib
    return env


class Restarter:
    """Kills and restarts krexds made by ``krexd_factory`` on the same config and socket."""

    def __init__(self) -> None:
        self.started: list[Krexd] = []

    def kill(self, k: Krexd, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to krexd and wait for it to exit."""
        k.proc.send_signal(sig)
        k.proc.wait(20)

    def start_again(self, k: Krexd, wait: bool = True, args: Sequence[str] = ()) -> Krexd:
        """A new krexd on ``k``'s config (same socket, cgroup name, state directory);
        ``args``: more of krexd's arguments (as ``krexd_factory``'s, e.g. the fake vendor)."""
        config = os.path.join(k.workdir, "krex.toml")
        log = open(k.log_path, "ab")  # noqa: SIM115 - kept open by the child
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "krexd",
                "--foreground",
                "--config",
                config,
                "--fake-gpus",
                str(len(k.status()["gpus"]) if k.proc.poll() is None else 1),
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(**driver_env(k)),
            cwd=REPO,
        )
        log.close()
        new = Krexd(proc, k.socket, k.workdir, k.cgroup_name, k.log_path)
        new.cgroup_dirs = list(k.cgroup_dirs)
        self.started.append(new)
        if wait:
            new.wait_ready()
        return new

    def prepare_restart(self, k: Krexd) -> None:
        """``krexd --prepare-restart`` on ``k``'s config."""
        config = os.path.join(k.workdir, "krex.toml")
        subprocess.run(
            [sys.executable, "-m", "krexd", "--config", config, "--prepare-restart"],
            check=True,
            env=clean_env(),
            cwd=REPO,
            timeout=30,
        )


@pytest.fixture
def restarter() -> Iterator[Restarter]:
    r = Restarter()
    yield r
    for k in r.started:
        if k.proc.poll() is None:
            k.stop(check=False)
