"""krexd configuration: TOML (``tomllib``) into frozen dataclasses, one per table.

Every key is optional (defaults below, documented in ``etc/krex.toml``).
Unknown tables/keys and bad values are refused at start with a
:class:`ConfigError` whose message names the key, e.g.
``[cgroup] nmae: unknown key``.  The checkers of single values and the
core-list syntax are in ``krexd.config.values``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krexd.config.slot_count import check_setting as _slots
from krexd.config.tables import WARM_KEY_NAMES as WARM_KEY_NAMES  # re-exported
from krexd.config.tables import WARM_KEY_PREFIXES as WARM_KEY_PREFIXES  # re-exported
from krexd.config.tables import CacheConfig as CacheConfig  # re-exported
from krexd.config.tables import MetricsConfig as MetricsConfig  # re-exported
from krexd.config.tables import WarmConfig as WarmConfig  # re-exported

# The checkers keep their short private names here, so the schema reads as before.
from krexd.config.values import abs_path_or_empty as _abs_path_or_empty
from krexd.config.values import boolean as _bool
from krexd.config.values import cgroup_name as _cgroup_name
from krexd.config.values import choice as _choice
from krexd.config.values import float_nonneg as _float_nonneg
from krexd.config.values import float_pos as _float_pos
from krexd.config.values import float_range as _float_range
from krexd.config.values import format_cores as format_cores  # re-exported
from krexd.config.values import host as _host
from krexd.config.values import integer as _int
from krexd.config.values import integer_or_auto as _int_or_auto
from krexd.config.values import octal_mode as _mode
from krexd.config.values import parse_cores as parse_cores  # re-exported
from krexd.config.values import pattern_list as _pattern_list
from krexd.config.values import size as _size
from krexd.config.values import slices_table as _slices
from krexd.config.values import socket_path as _socket_path
from krexd.config.values import string as _str

DEFAULT_SOCKET = "/run/krex/krexd.sock"
SYSTEM_CONFIG = "/etc/krex/krex.toml"


class ConfigError(ValueError):
    """Invalid configuration; the message names the table and key."""


@dataclass(frozen=True)
class DaemonConfig:
    """``[daemon]``: socket path, its permissions, where gate files go, fake GPUs, priority."""

    socket: str = DEFAULT_SOCKET
    state_dir: str = ""  # "" -> the socket's directory
    socket_group: str = ""  # "" -> leave krexd's primary group
    socket_mode: int = 0o660
    fake_gpus: int = 0
    fake_vendor: str = (
        "nvidia"  # of the simulated GPUs: "nvidia" or "amd" (krexd.hardware.inventory)
    )
    log_level: str = "info"
    liveness_interval_ms: int = 200
    max_connections: int = 1024  # open control connections; more are refused
    # Fair shares (krexd/server/connections.py, krexd/server/lanes.py); root is exempt, 0: no cap.
    max_connections_per_uid: int = 128  # open control connections of one uid
    max_requests_per_uid: int = 256  # requests of one uid in progress (parked admits too)
    max_status_per_uid: int = 4  # status requests of one uid queued or running
    status_per_s_per_uid: float = 10.0  # status requests of one uid served per second (0: any)
    idle_timeout_s: float = 300.0  # a connection with no request for this long is closed
    # New connections of one uid served per second after a burst (krexd/server/ratelimit.py).
    connections_per_s_per_uid: float = 50.0
    connection_burst_per_uid: int = 256
    freeze_bound_s: float = 20.0  # longest freeze without a live krexd (krexd/restarts/watchdog.py)
    adopt: bool = True  # a restarted krexd adopts the tenants of the one before
    # krexd's nice value: region entry runs while up to a GPU's worth of siblings
    # compete for the CPU (krexd/cli/krexd.py, _set_priority).
    nice: int = -5

    @property
    def gate_dir(self) -> str:
        """Directory of the gate files (``state_dir`` or the socket's directory)."""
        return self.state_dir or os.path.dirname(os.path.abspath(self.socket))


@dataclass(frozen=True)
class AdmissionConfig:
    """``[admission]``: command concurrency (slots) per GPU, parking and per-uid limits.

    ``slots_per_gpu``: ``"auto"`` (derived per GPU from its tenant cores and
    memory, ``krexd.config.slot_count``) or a fixed count for every GPU.

    ``place_timeout_s``: an admitted command not placed in its cgroup within
    this many seconds is ended and its slot freed (no squatting).
    ``max_admitted_per_uid`` / ``max_parked_per_uid``: per-uid caps (0 = no
    cap; root is exempt), see ``krexd.tenancy.quotas``; ``max_admitted_per_uid`` -1
    (the default) is half the host's slots, rounded up.
    ``max_argv_bytes``: an ``admit`` whose argv is larger (UTF-8 bytes of
    every argument plus one per argument) is refused ``BAD_FIELD``.
    """

    slots_per_gpu: int | str = "auto"  # "auto" (krexd.config.slot_count) or a fixed count
    max_parked: int = 4096
    place_timeout_s: float = 5.0
    max_admitted_per_uid: int = -1
    max_parked_per_uid: int = 64
    max_argv_bytes: int = 64 << 10

    def admitted_cap(self, total_slots: int) -> int:
        """``max_admitted_per_uid`` for a host of ``total_slots`` slots (-1: half, rounded up)."""
        if self.max_admitted_per_uid >= 0:
            return self.max_admitted_per_uid
        return max(1, (total_slots + 1) // 2)


@dataclass(frozen=True)
class CgroupConfig:
    """``[cgroup]``: backend choice and where krexd builds ``<root>/<name>/gpu<N>/t<id>``."""

    name: str = "krex"
    backend: str = "auto"  # auto | v2 | hybrid
    root: str = ""  # "" -> own cgroup under systemd, else the cgroup2 mount
    cpuset_root: str = ""  # hybrid hosts: v1 cpuset parent ("" -> the v1 cpuset mount)
    pids_max: int = 4096  # tasks (processes and threads) per tenant cgroup; 0: no limit


@dataclass(frozen=True)
class GpuConfig:
    """``[gpu]``: ``device_isolation``: each tenant cgroup may open only its GPU's device
    node (a cgroup device program): ``auto`` when the kernel allows, ``require``
    (krexd does not start without it) or ``off`` (krexd/cgroups/devices.py)."""

    device_isolation: str = "auto"


@dataclass(frozen=True)
class CpuConfig:
    """``[cpu]``: per-GPU CPU slices (explicit, or computed) and reserved cores."""

    reserved_cores: int = 1
    allow_shared: bool = False
    slices: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class RegionConfig:
    """``[region]``: limits of the region protocol (coordinator)."""

    max_region_s: float = 600.0
    drain_timeout_s: float = 10.0
    freeze_timeout_s: float = 10.0
    l2_flush: bool = True
    enforce: bool = True  # false: regions are recorded, not enforced ("ungated" mode)
    # The holder's cores in a region: "add" (reserved cores added to what it had) or
    # "reserved_only" (its submitting thread on the reserved cores alone).
    holder_cpus: str = "add"
    # The driver's lock of every other process on the GPU at entry (docs/design/
    # driver-lock.md): "auto" (where the driver can), "require" (entries fail where
    # it cannot), "off" (the shim's acknowledgements alone).
    driver_lock: str = "auto"
    # Processes outside krex found on the GPU at entry: "lock" them with the
    # siblings, "refuse" the region (FOREIGN_GPU_USER), or "allow" and flag it.
    foreign: str = "lock"


@dataclass(frozen=True)
class ShimConfig:
    """``[shim]``: explicit shim library path ("" -> search, see krexd.system.paths)."""

    path: str = ""


@dataclass(frozen=True)
class MpsConfig:
    """``[mps]``: an NVIDIA MPS control daemon per GPU, started and stopped by krexd."""

    enabled: bool = False
    control: str = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class MemoryConfig:
    """``[memory]``: admission by GPU memory and co-tenant out-of-memory waits (bytes, s, ms)."""

    admission: bool = True
    default_need: int = 1 << 30  # need of a command without `krex run --mem`
    headroom: int = 1 << 30  # kept free on every GPU
    max_bypass: int = 4  # later commands that may overtake one waiting for memory
    oom_wait_s: float = 30.0  # bound of a co-tenant out-of-memory wait (0: no wait)
    refresh_ms: int = 100
    learn: bool = True  # charge commands what earlier runs of their label used
    learned_max: int = 4096  # labels whose needs are kept (least recently used dropped)
    learned_per_uid: int = 256  # labels kept per uid (its least recently used dropped)
    # The learned needs' file ("": <state_dir>/<cgroup name>-learned-memory.json); krexd
    # instances that should learn from each other (successive replays) name one file.
    learned_file: str = ""
    region_wait_s: float = 10.0  # bound of a region entry's wait for siblings' memory
    retry_tempfail: int = 0  # default of `krex run --retry-tempfail N`


@dataclass(frozen=True)
class Config:
    """The whole configuration; ``source`` is the file it came from ("" for defaults)."""

    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    cgroup: CgroupConfig = field(default_factory=CgroupConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    cpu: CpuConfig = field(default_factory=CpuConfig)
    region: RegionConfig = field(default_factory=RegionConfig)
    shim: ShimConfig = field(default_factory=ShimConfig)
    mps: MpsConfig = field(default_factory=MpsConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    warm: WarmConfig = field(default_factory=WarmConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    source: str = ""


def _existing_file_or_empty(value: Any) -> str:
    """An absolute path of an existing file, or "" (nothing configured: search)."""
    path = _abs_path_or_empty(value)
    if path and not os.path.isfile(path):
        raise ValueError(f"{path}: no such file (krexd does not search elsewhere for it)")
    return path


_SCHEMA: dict[str, tuple[type[Any], dict[str, Callable[[Any], Any]]]] = {
    "daemon": (
        DaemonConfig,
        {
            "socket": _socket_path,
            "state_dir": _abs_path_or_empty,
            "socket_group": _str,
            "socket_mode": _mode,
            "fake_gpus": _int(0, 64),
            "fake_vendor": _choice("nvidia", "amd"),
            "log_level": _choice("debug", "info", "warning", "error"),
            "liveness_interval_ms": _int(10, 60_000),
            "max_connections": _int(8, 1_000_000),
            "max_connections_per_uid": _int(0, 1_000_000),
            "max_requests_per_uid": _int(0, 1_000_000),
            "max_status_per_uid": _int(0, 1_000_000),
            "status_per_s_per_uid": _float_range(0.0, 1_000_000.0),
            "idle_timeout_s": _float_range(0.0, 7 * 86400.0),
            "connections_per_s_per_uid": _float_range(0.0, 1_000_000.0),
            "connection_burst_per_uid": _int(1, 1_000_000),
            "freeze_bound_s": _float_range(1.0, 3600.0),
            "adopt": _bool,
            "nice": _int(-20, 19),
        },
    ),
    "admission": (
        AdmissionConfig,
        {
            "slots_per_gpu": _slots,
            "max_parked": _int(1, 1_000_000),
            "place_timeout_s": _float_range(0.05, 3600.0),
            "max_admitted_per_uid": _int(-1, 1_000_000),
            "max_parked_per_uid": _int(0, 1_000_000),
            "max_argv_bytes": _int(4096, 1 << 20),
        },
    ),
    "cgroup": (
        CgroupConfig,
        {
            "name": _cgroup_name,
            "backend": _choice("auto", "v2", "hybrid"),
            "root": _abs_path_or_empty,
            "cpuset_root": _abs_path_or_empty,
            "pids_max": _int(0, 1 << 22),
        },
    ),
    "gpu": (GpuConfig, {"device_isolation": _choice("auto", "require", "off")}),
    "cpu": (
        CpuConfig,
        {"reserved_cores": _int(0, 1024), "allow_shared": _bool, "slices": _slices},
    ),
    "region": (
        RegionConfig,
        {
            "max_region_s": _float_nonneg,  # 0: no limit
            "drain_timeout_s": _float_pos,
            "freeze_timeout_s": _float_pos,
            "l2_flush": _bool,
            "enforce": _bool,
            "holder_cpus": _choice("add", "reserved_only"),
            "driver_lock": _choice("auto", "require", "off"),
            "foreign": _choice("lock", "refuse", "allow"),
        },
    ),
    "shim": (ShimConfig, {"path": _existing_file_or_empty}),
    "mps": (MpsConfig, {"enabled": _bool, "control": _str}),
    "memory": (
        MemoryConfig,
        {
            "admission": _bool,
            "default_need": _size,
            "headroom": _size,
            "max_bypass": _int(0, 1_000_000),
            "oom_wait_s": _float_range(0.0, 86400.0),
            "refresh_ms": _int(10, 60_000),
            "learn": _bool,
            "learned_max": _int(1, 1_000_000),
            "learned_per_uid": _int(1, 1_000_000),
            "learned_file": _abs_path_or_empty,
            "region_wait_s": _float_range(0.0, 86400.0),
            "retry_tempfail": _int(0, 100),
        },
    ),
    "warm": (
        WarmConfig,
        {
            "enabled": _bool,
            "start": _choice("warm", "cold"),
            "modules": _pattern_list(
                r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "module"
            ),
            "max_pools_per_uid": _int(1, 1024),
            "memory_max": _size,
            "pids_max": _int_or_auto(0, 1 << 22),
            "idle_s": _float_range(1.0, 7 * 86400.0),
            "key_prefixes": _pattern_list(r"[A-Za-z_][A-Za-z0-9_]*", "variable name prefix"),
            "key_names": _pattern_list(r"[A-Za-z_][A-Za-z0-9_]*", "variable name"),
        },
    ),
    "cache": (CacheConfig, {"enabled": _bool, "dir": _abs_path_or_empty, "max_bytes": _size}),
    "metrics": (
        MetricsConfig,
        {"enabled": _bool, "address": _host, "port": _int(0, 65535)},
    ),
}


def from_dict(data: dict[str, Any], source: str = "") -> Config:
    """Validate a parsed TOML document (``dict``) into a :class:`Config`."""
    tables: dict[str, Any] = {}
    for table, content in data.items():
        if table not in _SCHEMA:
            raise ConfigError(f"[{table}]: unknown table (known: {', '.join(_SCHEMA)})")
        if not isinstance(content, dict):
            raise ConfigError(f"{table}: must be a table, got {type(content).__name__}")
        cls, checkers = _SCHEMA[table]
        values: dict[str, Any] = {}
        for key, value in content.items():
            if key not in checkers:
                raise ConfigError(f"[{table}] {key}: unknown key (known: {', '.join(checkers)})")
            try:
                values[key] = checkers[key](value)
            except ValueError as exc:
                raise ConfigError(f"[{table}] {key}: {exc}") from None
        tables[table] = cls(**values)
    return Config(**tables, source=source)


def default_path() -> str | None:
    """Config used when none is named: ``KREX_CONFIG``, ``/etc/krex/krex.toml``, or the
    source checkout's ``etc/krex.toml``; ``None`` means built-in defaults."""
    env = os.environ.get("KREX_CONFIG")
    if env:
        return env
    if os.path.exists(SYSTEM_CONFIG):
        return SYSTEM_CONFIG
    checkout = Path(__file__).resolve().parents[2] / "etc" / "krex.toml"
    return str(checkout) if checkout.exists() else None


def load(path: str | None) -> Config:
    """Read and validate the TOML file at ``path`` (``None``: :func:`default_path`)."""
    path = path if path is not None else default_path()
    if path is None:
        return Config()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): not a TOML file") from None
    except (ValueError, RecursionError) as exc:  # what else tomllib may raise on garbage
        raise ConfigError(f"{path}: not valid TOML: {type(exc).__name__}") from None
    try:
        return from_dict(data, source=os.path.abspath(path))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def with_overrides(
    cfg: Config,
    socket: str | None = None,
    fake_gpus: int | None = None,
    fake_vendor: str | None = None,
) -> Config:
    """Apply command-line overrides (``--socket``, ``--fake-gpus``, ``--fake-vendor``)."""
    daemon = cfg.daemon
    try:
        if socket is not None:
            daemon = dataclasses.replace(daemon, socket=_socket_path(socket))
        if fake_gpus is not None:
            daemon = dataclasses.replace(daemon, fake_gpus=_int(0, 64)(fake_gpus))
        if fake_vendor is not None:
            daemon = dataclasses.replace(daemon, fake_vendor=_choice("nvidia", "amd")(fake_vendor))
    except ValueError as exc:
        raise ConfigError(f"command line: {exc}") from None
    return dataclasses.replace(cfg, daemon=daemon)
