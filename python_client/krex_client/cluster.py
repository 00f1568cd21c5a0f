"""Run benchmarking commands on a Ray cluster of krex hosts.

Ray places each command on a host (one ``krex_slot``); that host's krexd
enforces, through a task that runs ``krex run`` against it
(``krex_client.cluster_task``).  Usage: python_client/README.md "Commands
on a Ray cluster"; the names the parts share and what failures do:
docs/design/interfaces.md "Several hosts (Ray)", docs/install.md "Several
hosts".  Ray is imported only when a function here needs it.
"""

from __future__ import annotations

import os
import re
import socket as pysocket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SLOT = "krex_slot"
"""The Ray resource a command asks for: one of a host's krexd slots."""
GPU = "krex_gpu"
"""The Ray resource counting a host's krexd GPUs."""
HOST_PREFIX = "krex_host_"
"""Prefix of the resource naming a host (``krex_host_<NAME>``), as many as its slots."""
OUTPUT_TAIL = 64 * 1024
"""Bytes of stdout and of stderr a result keeps: the last ones."""
RESERVED_ENV = ("KREX_SOCKET", "KREX_HOST")
"""Variables a command may not set: they name the host's own krexd and name."""
STARTS = (None, "warm", "cold")
"""A command's ``start`` values: krexd's default, ``krex run --warm``, ``--cold``."""


def host_name(name: str | None = None) -> str:
    """A host's krex name: ``name``, else ``$KREX_HOST``, else the host name.

    Characters other than letters, digits, ``.``, ``-`` and ``_`` become ``_``.
    """
    raw = name or os.environ.get("KREX_HOST") or pysocket.gethostname()
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)


def host_resource(name: str) -> str:
    """The Ray resource that names host ``name``: ``krex_host_<NAME>``."""
    return HOST_PREFIX + host_name(name)


@dataclass(frozen=True)
class Command:
    """One benchmarking command to run on some krex host.

    argv: the command; cwd: its directory on the host (None: the Ray
    worker's); env: variables added to the host's environment (not
    ``KREX_SOCKET``/``KREX_HOST``); mem: its GPU memory need, bytes or a
    size like ``"8G"`` (``krex run --mem``); label: its name for learned
    memory needs (``--label``); timeout_s: time limit, after which its
    process tree is killed and the exit code is 124 (``--timeout``);
    region_log: collect its region records (``--region-log``); gpu: a GPU
    index on the host (``--gpu``); host: run only on this host (by name);
    prefer_host: run on this host while it is up, elsewhere when it is gone;
    start: ``"warm"`` (``krex run --warm``: from a warm pool when one can
    serve it), ``"cold"`` (``--cold``: a fresh process) or None (no flag: as
    the host krexd's ``[warm] start`` says, warm as shipped).
    """

    argv: Sequence[str]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    mem: int | str | None = None
    label: str | None = None
    timeout_s: float | None = None
    region_log: bool = True
    gpu: int | None = None
    host: str | None = None
    prefer_host: str | None = None
    start: str | None = None

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError("argv must be a non-empty list of strings")
        bad = sorted(set(self.env) & set(RESERVED_ENV))
        if bad:
            raise ValueError(f"env may not set {', '.join(bad)}: the host's krexd decides them")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.start not in STARTS:
            raise ValueError(f"start must be 'warm', 'cold' or None, got {self.start!r}")

    def krex_run_options(self) -> list[str]:
        """``krex run``'s options for this command (not the log files, not ``--``)."""
        opts: list[str] = []
        if self.gpu is not None:
            opts += ["--gpu", str(self.gpu)]
        if self.mem is not None:
            opts += ["--mem", str(self.mem)]
        if self.label is not None:
            opts += ["--label", self.label]
        if self.timeout_s is not None:
            opts += ["--timeout", repr(float(self.timeout_s))]
        if self.start is not None:
            opts.append(f"--{self.start}")
        return opts


@dataclass(frozen=True)
class Timings:
    """When a command was submitted, started on its host, admitted by krexd and ended.

    Unix times (s): ``submitted`` on the driver's clock, the others on the
    host's (``queued_s`` includes any skew between the two clocks).
    ``admitted`` is None when krexd never admitted the command;
    ``admit_wait_s`` is how long ``krex run`` waited for its slots, summed
    over its admissions (``krex run``'s own re-runs admit again).
    """

    submitted: float
    started: float
    admitted: float | None
    ended: float
    admit_wait_s: float

    @property
    def queued_s(self) -> float:
        """Submission to the start on the host: Ray's queue and worker start."""
        return self.started - self.submitted

    @property
    def ran_s(self) -> float | None:
        """Admission to the end: the command's run (None when never admitted)."""
        return None if self.admitted is None else self.ended - self.admitted


@dataclass(frozen=True)
class Result:
    """What a command did: its ``krex run`` exit code, output tails, regions, place, timings.

    exit_code: ``krex run``'s (the command's own, or krex run's: 124
    timeout, 69 krexd unreachable, ...; 128+N for signal N);
    stdout/stderr: the last :data:`OUTPUT_TAIL` bytes each (decoded, errors
    replaced), stdout_bytes/stderr_bytes: how much there was; regions: the
    region records (docs/design/region-log.md); host: the host's krex name,
    node_id: its Ray node; gpu, gpu_uuid, tenant: krexd's last grant (None
    when never admitted); attempt: 1, or more when Ray ran the command again
    after losing a worker or host; admissions: how often krexd admitted it.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    regions: list[dict[str, Any]]
    host: str
    node_id: str | None
    gpu: int | None
    gpu_uuid: str | None
    tenant: int | None
    attempt: int
    admissions: int
    timings: Timings

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0


_REMOTE: Any = None


def _remote() -> Any:
    """The Ray remote function running :func:`krex_client.cluster_task.execute` (made once)."""
    global _REMOTE
    if _REMOTE is None:
        import ray

        from krex_client import cluster_task

        _REMOTE = ray.remote(cluster_task.execute)
    return _REMOTE


def task_options(command: Command, max_retries: int) -> dict[str, Any]:
    """Ray options of a command's task: one ``krex_slot``, no CPU, retries, placement.

    ``command.prefer_host`` needs a connected Ray (it looks the node up).
    Raises LookupError when no live node carries that host's resource.
    """
    resources = {SLOT: 1.0}
    if command.host is not None:
        resources[host_resource(command.host)] = 1.0
    opts: dict[str, Any] = {
        "num_cpus": 0,
        "resources": resources,
        "max_retries": max_retries,
        "retry_exceptions": False,
        "name": f"krex run {os.path.basename(command.argv[0])}",
    }
    if command.prefer_host is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_of(command.prefer_host), soft=True
        )
    return opts


def node_of(host: str) -> str:
    """The Ray node id of the live node advertising host ``host`` (LookupError when none)."""
    import ray

    wanted = host_resource(host)
    for node in ray.nodes():
        if node.get("Alive") and wanted in (node.get("Resources") or {}):
            return str(node["NodeID"])
    raise LookupError(f"no live Ray node advertises {wanted}")


def submit(
    command: Command,
    *,
    max_retries: int = 2,
    cancel_grace_s: float = 5.0,
    krex: Sequence[str] | None = None,
) -> Any:
    """Submit ``command`` to the connected Ray cluster; returns the task's ``ObjectRef``.

    ``ray.get`` on it gives a :class:`Result`.  ``max_retries``: runs after
    a lost worker or host (Ray's task retries; a command that merely fails
    is not run again).  ``cancel_grace_s``: after ``ray.cancel``, seconds
    between SIGTERM and SIGKILL to ``krex run``.  ``krex``: how to call
    ``krex`` on the hosts (default: ``$KREX_CLI`` there, else ``krex`` on
    its PATH, else ``python -m krex_cli``).
    """
    fn = _remote().options(**task_options(command, max_retries))
    return fn.remote(command, time.time(), cancel_grace_s, list(krex) if krex else None)


def run(command: Command, **kwargs: Any) -> Result:
    """Submit ``command`` (keyword arguments as :func:`submit`) and wait for its result."""
    import ray

    result: Result = ray.get(submit(command, **kwargs))
    return result


def capacity() -> dict[str, float]:
    """Per host name, the ``krex_slot`` Ray sees on live nodes (the connected cluster)."""
    import ray

    out: dict[str, float] = {}
    for node in ray.nodes():
        res = node.get("Resources") or {}
        if not node.get("Alive") or SLOT not in res:
            continue
        names = [k[len(HOST_PREFIX) :] for k in res if k.startswith(HOST_PREFIX)]
        out[names[0] if names else str(node["NodeID"])] = float(res[SLOT])
    return out
