"""A Ray cluster of krex "hosts" on one machine: one krexd and one Ray node per host.

``krex_cluster`` (one per test module) starts a Ray head node that runs no
command (no ``krex_slot``) and two hosts, ``a`` and ``b``: each a real krexd
(``--fake-gpus 2``, one slot per GPU, its own socket and cgroup name) and a
Ray node whose resources come from that krexd (``krex ray-resources``'s
:func:`krex_cli.ray_resources.query`) and whose environment names it
(``KREX_SOCKET``, ``KREX_HOST``), as ``krex ray-resources --exec -- ray
start`` does on a real host.  Ray's files go under a temporary directory
(``RAY_TMPDIR``); the cluster and every krexd are stopped after the module.
Ray nodes are small (1 CPU, 80 MB object store); commands ask for no CPU.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from krex_cli import ray_resources
from tests.support import clean_env
from tests.support.krexd import REPO, Krexd, make_config, render_toml

OBJECT_STORE = 80 * 1024 * 1024
_names = itertools.count()


def start_krexd(workdir: str, fake_gpus: int, slots: int) -> Krexd:
    """A krexd on ``workdir/krexd.sock`` with a cgroup name of its own; waits until ready."""
    socket = os.path.join(workdir, "krexd.sock")
    name = f"krexray{os.getpid()}n{next(_names)}"
    config = os.path.join(workdir, "krex.toml")
    with open(config, "w") as f:
        f.write(render_toml(make_config(socket, name, slots)))
    log_path = os.path.join(workdir, "krexd.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "krexd", "--foreground", "--config", config]
            + ["--fake-gpus", str(fake_gpus)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            cwd=REPO,
        )
    k = Krexd(proc, socket, workdir, name, log_path)
    k.wait_ready()
    cg = k.status()["cgroups"]
    k.cgroup_dirs = [d for d in (cg["root"], cg.get("cpuset_root"), cg.get("pids_root")) if d]
    return k


@dataclass
class Host:
    """One krex host of the test cluster: its name, krexd and Ray node."""

    name: str
    krexd: Krexd
    node: Any
    slots: int


class KrexCluster:
    """The Ray cluster and its hosts (see the module docstring)."""

    def __init__(self, tmp: str) -> None:
        from ray.cluster_utils import Cluster

        self.tmp = tmp
        self.hosts: dict[str, Host] = {}
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "object_store_memory": OBJECT_STORE,
                "include_dashboard": False,
            },
        )

    @property
    def address(self) -> str:
        """The head's GCS address (``ray.init(address=...)``, ``krex replay --ray``)."""
        return str(self.cluster.address)

    def add_host(self, name: str, fake_gpus: int = 2, slots: int = 1) -> Host:
        """Start host ``name``: its krexd, then a Ray node advertising that krexd's resources."""
        workdir = tempfile.mkdtemp(prefix=f"krex-{name}-", dir=self.tmp)
        os.chmod(workdir, 0o755)
        k = start_krexd(workdir, fake_gpus, slots)
        env = {
            "KREX_SOCKET": k.socket,
            "KREX_HOST": name,
            "KREX_CLI": f"{sys.executable} -m krex_cli",
            "SIMULATED_SLEEP": "1",
            # Work directories of killed tasks stay in the cluster's directory, removed after.
            "TMPDIR": self.tmp,
            # Ray's own clean-up of a dead worker's children off: what ends the command
            # when its worker dies must be krex's (krex run's parent-death signal).
            "RAY_kill_child_processes_on_worker_exit": "0",
        }
        node = self.cluster.add_node(
            num_cpus=1,
            object_store_memory=OBJECT_STORE,
            resources=ray_resources.query(k.socket, name),
            env_vars=env,
        )
        host = Host(name, k, node, fake_gpus * slots)
        self.hosts[name] = host
        return host

    def remove_host(self, name: str) -> None:
        """Take host ``name``'s Ray node away (its workers die); its krexd keeps running."""
        self.cluster.remove_node(self.hosts[name].node, allow_graceful=False)

    def shutdown(self) -> None:
        """Stop Ray, then every krexd (checking each left no socket or cgroup behind)."""
        import ray

        ray.shutdown()
        self.cluster.shutdown()
        for host in self.hosts.values():
            host.krexd.stop()


@pytest.fixture(scope="module")
def krex_cluster() -> Iterator[KrexCluster]:
    """Hosts ``a`` and ``b`` (2 fake GPUs, 2 slots each) in a local Ray cluster; connected."""
    import ray

    tmp = tempfile.mkdtemp(prefix="kr")  # short: Ray's socket paths must fit in 107 bytes
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    c: KrexCluster | None = None
    try:
        c = KrexCluster(tmp)
        for name in ("a", "b"):
            c.add_host(name)
        ray.init(address=c.address, logging_level="warning", log_to_driver=False)
        yield c
    finally:
        if c is not None:
            c.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        if not os.environ.get("KREX_KEEP_TEST_DIRS"):
            shutil.rmtree(tmp, ignore_errors=True)
