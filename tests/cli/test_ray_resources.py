"""``krex ray-resources``: a host's Ray resources come from its krexd, not from a human."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from krex_cli import ray_resources
from tests.support.krexd import KREX, Krexd


def krex(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KREX, "ray-resources", *args], capture_output=True, text=True, timeout=30, env=env
    )


def test_resources_are_krexds_slots_gpus_and_the_host() -> None:
    status = {"gpus": [{"slots_total": 4}, {"slots_total": 3}], "socket": "/s"}
    res = ray_resources.from_status(status, "gpu-host.1")
    assert res == {"krex_slot": 7.0, "krex_gpu": 2.0, "krex_host_gpu-host.1": 7.0}
    assert ray_resources.ray_start_args(res) == [
        "--num-gpus",
        "2",
        "--resources",
        '{"krex_gpu":2,"krex_host_gpu-host.1":7,"krex_slot":7}',
    ]
    with pytest.raises(ValueError, match="no slot"):
        ray_resources.from_status({"gpus": [], "socket": "/s"}, "h")


def test_usage_errors_and_an_absent_krexd(tmp_path: Path) -> None:
    p = krex("--exec")
    assert p.returncode == 2 and "--exec needs a command" in p.stderr
    p = krex("--exec", "--", "ray", "start", "--enable-resource-isolation")
    assert p.returncode == 2 and "cgroups to krexd" in p.stderr
    p = krex("--", "ray", "start")
    assert p.returncode == 2 and "only with --exec" in p.stderr
    p = krex("--socket", str(tmp_path / "none.sock"))
    assert p.returncode == 69 and "cannot reach krexd" in p.stderr


@pytest.mark.root
def test_printed_and_execd_resources_match_krexd(
    krexd_factory: Callable[..., Krexd], tmp_path: Path
) -> None:
    k = krexd_factory(fake_gpus=2, slots=3)
    p = krex("--socket", k.socket, "--host", "n1", env=k.env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"krex_slot": 6, "krex_gpu": 2, "krex_host_n1": 6}
    # --exec: the command gets the resources as ray start's arguments, and the
    # host's krexd and name in its environment (Ray's processes inherit them).
    show = (
        "import json, os, sys; "
        "print(json.dumps([sys.argv[1:], os.environ['KREX_SOCKET'], os.environ['KREX_HOST']]))"
    )
    p = krex(
        "--socket",
        k.socket,
        "--host",
        "n1",
        "--exec",
        "--",
        sys.executable,
        "-c",
        show,
        "start",
        env=k.env,
    )
    assert p.returncode == 0, p.stderr
    args, socket, host = json.loads(p.stdout)
    assert args[:3] == ["start", "--num-gpus", "2"] and args[3] == "--resources"
    assert json.loads(args[4]) == {"krex_slot": 6, "krex_gpu": 2, "krex_host_n1": 6}
    assert socket == k.socket and host == "n1"
