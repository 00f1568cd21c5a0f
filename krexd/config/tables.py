"""``[warm]``, ``[cache]`` and ``[metrics]``: tables kept apart from ``krexd.config.config``.

``krexd.config.config`` re-exports them; its schema checks their keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

#: ``[warm] key_prefixes`` / ``key_names`` defaults: the environment a framework's import reads.
WARM_KEY_PREFIXES = (
    "PYTHON",
    "TORCH",
    "PYTORCH",
    "TRITON",
    "CUDA",
    "NCCL",
    "LD_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "MALLOC_",
    "LC_",
)
WARM_KEY_NAMES = ("VIRTUAL_ENV", "CONDA_PREFIX", "HOME", "LANG", "LANGUAGE", "TZ", "GLIBC_TUNABLES")


@dataclass(frozen=True)
class WarmConfig:
    """``[warm]``: warm pools for ``krex run --warm`` (docs/design/warm.md).

    ``modules``: what a pool imports before it serves (missing ones are
    skipped); ``max_pools_per_uid``: pools one user may have at once;
    ``memory_max``: memory limit of a pool's cgroup (bytes; 0 = none);
    ``pids_max``: tasks (processes and threads) a pool's cgroup may hold
    (0 = no limit; ``"auto"``: :meth:`pool_tasks`): every region freezes the
    pools, and the freeze's cost grows with their threads;
    ``idle_s``: a pool exits after this long without a command;
    ``key_prefixes`` / ``key_names``: the environment variables a pool is
    keyed by (a command whose values differ gets another pool);
    ``start``: how ``krex run`` starts a command given neither ``--warm``
    nor ``--cold`` ("warm" since warm starts measured 1.65x cold's
    throughput on the H200: docs/bench/warm-starts-h200.md).
    """

    enabled: bool = True
    start: str = "warm"
    modules: tuple[str, ...] = ("torch", "triton")
    max_pools_per_uid: int = 2
    memory_max: int = 16 << 30
    pids_max: int | str = "auto"
    idle_s: float = 600.0
    key_prefixes: tuple[str, ...] = WARM_KEY_PREFIXES
    key_names: tuple[str, ...] = WARM_KEY_NAMES

    def pool_tasks(self) -> int:
        """``pids_max`` as a number of tasks (0: no limit).

        ``"auto"``: the host's CPUs plus 16.  A pool that imported torch holds
        numpy's OpenBLAS pool, one thread per CPU but one
        (``krex_cli.warm.krexpool_zygote``); the 16 leave room for its
        unplaced children (a fork the limit refuses starts that command
        cold).  Measured on a 2-core host: another user's region entry p50
        moved by a median 7 % beside one user's two pools of 18 tasks each
        (this cap there), 25 % beside two of 34 (docs/bench/status-flood.md).
        """
        if self.pids_max == "auto":
            return (os.cpu_count() or 1) + 16
        return int(self.pids_max)

    def announce(self) -> dict[str, Any]:
        """What ``ping`` tells ``krex run`` (the settings a pool key and a keeper use)."""
        return {
            "enabled": self.enabled,
            "start": self.start,
            "modules": list(self.modules),
            "idle_s": self.idle_s,
            "key_prefixes": list(self.key_prefixes),
            "key_names": list(self.key_names),
            "max_pools_per_uid": self.max_pools_per_uid,
            "memory_max": self.memory_max,
            # place accepts "cold" (krex_client.cold_reasons): krexd counts cold starts by reason.
            "cold_reasons": True,
        }


@dataclass(frozen=True)
class CacheConfig:
    """``[cache]``: per-user compile caches ``krex run`` gives commands (krex_cli.compile_cache).

    ``enabled``: set ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and
    ``CUDA_CACHE_PATH`` where the user did not; ``dir``: a root holding one
    directory per uid ("" = each user's ``$XDG_CACHE_HOME/krex/compile``);
    ``max_bytes``: each user's directory is trimmed to this after a command
    (bytes; 0 = never).  krexd only announces them (``ping``): ``krex run``,
    running as the user, creates and trims the directories.
    """

    enabled: bool = True
    dir: str = ""
    max_bytes: int = 10 << 30

    def announce(self) -> dict[str, Any]:
        """What ``ping`` tells ``krex run``."""
        return {"enabled": self.enabled, "dir": self.dir, "max_bytes": self.max_bytes}


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: krexd's Prometheus endpoint (``krexd.server.metrics``).

    ``enabled``: serve it (off by default); ``address``: the address it
    binds (``127.0.0.1``: this host only); ``port``: its TCP port
    (``/metrics`` over HTTP; 0: any free port, shown by ``status``).
    """

    enabled: bool = False
    address: str = "127.0.0.1"
    port: int = 9464
