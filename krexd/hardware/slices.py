"""Per-GPU CPU slices and reserved cores (paper §4.2 "CPU exclusivity").

Each GPU's tenants run on its ``tenant_cores`` off-region, and the holder's
submitting thread on its ``reserved`` cores during a region; slices are
configured (``[cpu.slices]``) or computed, and may share cores on small
machines only with ``[cpu] allow_shared``.  docs/design/daemon.md "CPU
slices, including small machines".
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from krexd.config.config import ConfigError, CpuConfig, format_cores, parse_cores
from krexd.hardware.inventory import GpuInfo


@dataclass(frozen=True)
class CpuSlice:
    """GPU ``gpu``'s slice: all ``cores``, ``reserved`` ones, ``tenant_cores`` (core ids)."""

    gpu: int
    cores: tuple[int, ...]
    reserved: tuple[int, ...]
    tenant_cores: tuple[int, ...]
    shared: bool = False

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form used by ``krexctl status --json``."""
        return {
            "cores": format_cores(self.cores),
            "reserved": format_cores(self.reserved),
            "tenant_cores": format_cores(self.tenant_cores),
            "shared": self.shared,
        }


def numa_cpus() -> dict[int, tuple[int, ...]]:
    """NUMA node -> its cores, from ``/sys/devices/system/node/node*/cpulist``."""
    out: dict[int, tuple[int, ...]] = {}
    for path in glob.glob("/sys/devices/system/node/node*/cpulist"):
        m = re.search(r"node(\d+)/cpulist$", path)
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if m and text:
            out[int(m.group(1))] = parse_cores(text)
    return out


def allowed_cores() -> tuple[int, ...]:
    """Cores krexd itself may run on (its affinity at start)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def _split(
    cores: tuple[int, ...], gpus: list[int], allow_shared: bool
) -> dict[int, tuple[int, ...]]:
    """Split ``cores`` into len(gpus) contiguous, near-equal, disjoint chunks."""
    n = len(gpus)
    if len(cores) < n:
        if not allow_shared:
            raise ConfigError(
                f"[cpu] only {len(cores)} core(s) ({format_cores(cores)}) for {n} GPUs; "
                "set [cpu] allow_shared = true or give [cpu.slices]"
            )
        return {g: (cores[i % len(cores)],) for i, g in enumerate(gpus)}
    out: dict[int, tuple[int, ...]] = {}
    base, extra = divmod(len(cores), n)
    start = 0
    for i, g in enumerate(gpus):
        size = base + (1 if i < extra else 0)
        out[g] = cores[start : start + size]
        start += size
    return out


def _computed(
    gpus: list[GpuInfo], allowed: tuple[int, ...], nodes: dict[int, tuple[int, ...]], shared: bool
) -> dict[int, tuple[int, ...]]:
    by_node: dict[int, list[int]] = {}
    unknown: list[int] = []
    for g in gpus:
        local = nodes.get(g.numa_node, ()) if g.numa_node is not None else ()
        if local and set(local) & set(allowed):
            by_node.setdefault(g.numa_node or 0, []).append(g.index)
        else:
            unknown.append(g.index)
    out: dict[int, tuple[int, ...]] = {}
    used: set[int] = set()
    for node, members in sorted(by_node.items()):
        local = tuple(c for c in nodes[node] if c in set(allowed))
        out.update(_split(local, members, shared))
        used.update(local)
    if unknown:
        rest = tuple(c for c in allowed if c not in used) or allowed
        out.update(_split(rest, unknown, shared))
    return out


def _check_overlap(raw: dict[int, tuple[int, ...]]) -> list[str]:
    problems = []
    items = sorted(raw.items())
    for i, (ga, ca) in enumerate(items):
        for gb, cb in items[i + 1 :]:
            common = set(ca) & set(cb)
            if common:
                problems.append(f"GPUs {ga} and {gb} overlap on cores {format_cores(common)}")
    return problems


def compute_slices(
    gpus: list[GpuInfo],
    cpu: CpuConfig,
    allowed: Iterable[int] | None = None,
    nodes: dict[int, tuple[int, ...]] | None = None,
) -> dict[int, CpuSlice]:
    """Build and validate every GPU's :class:`CpuSlice`; raise :class:`ConfigError` if invalid.

    ``allowed``: core ids krexd may use (default: its affinity); ``nodes``: NUMA
    node -> core ids (default: sysfs).  Refused: overlapping slices (unless
    ``allow_shared``), cores outside ``allowed``, slices left empty after
    reservation (unless ``allow_shared``), slices for GPUs that do not exist.
    """
    allowed_t = tuple(sorted(set(allowed))) if allowed is not None else allowed_cores()
    nodes = numa_cpus() if nodes is None else nodes
    indices = [g.index for g in gpus]
    if cpu.slices:
        raw = _configured(cpu, indices, allowed_t)
    else:
        raw = _computed(gpus, allowed_t, nodes, cpu.allow_shared)
    shared_any = bool(_check_overlap(raw))
    return {g: _reserve(g, raw[g], cpu, shared_any) for g in indices}


def _configured(
    cpu: CpuConfig, indices: list[int], allowed: tuple[int, ...]
) -> dict[int, tuple[int, ...]]:
    """``[cpu.slices]``, checked: one non-empty slice per GPU, allowed cores, no overlap."""
    extra = sorted(set(cpu.slices) - set(indices))
    if extra:
        raise ConfigError(f"[cpu.slices] GPU {extra[0]} does not exist (GPUs: {indices})")
    missing = sorted(set(indices) - set(cpu.slices))
    if missing:
        raise ConfigError(f"[cpu.slices] no slice for GPU {missing[0]}")
    raw = dict(cpu.slices)
    for g, cores in sorted(raw.items()):
        if not cores:
            raise ConfigError(f"[cpu.slices] GPU {g}: empty slice")
        bad = set(cores) - set(allowed)
        if bad:
            raise ConfigError(
                f"[cpu.slices] GPU {g}: cores {format_cores(bad)} do not exist or are not "
                f"allowed for krexd (allowed: {format_cores(allowed)})"
            )
    overlaps = _check_overlap(raw)
    if overlaps and not cpu.allow_shared:
        raise ConfigError(f"[cpu.slices] {overlaps[0]}; set [cpu] allow_shared = true")
    return raw


def _reserve(g: int, cores: tuple[int, ...], cpu: CpuConfig, shared: bool) -> CpuSlice:
    """GPU ``g``'s slice with its last ``reserved_cores`` cores reserved for the holder."""
    k = cpu.reserved_cores
    reserved = cores[len(cores) - k :] if 0 < k <= len(cores) else (cores if k else ())
    tenant = tuple(c for c in cores if c not in reserved)
    if k > len(cores) and not cpu.allow_shared:
        raise ConfigError(
            f"[cpu] reserved_cores = {k} but GPU {g}'s slice has only {len(cores)} core(s) "
            f"({format_cores(cores)}); lower it or set allow_shared = true"
        )
    if not tenant:
        if not cpu.allow_shared:
            raise ConfigError(
                f"[cpu] GPU {g}'s slice {format_cores(cores)} is empty after reserving "
                f"{k} core(s); lower reserved_cores, give larger [cpu.slices], "
                "or set allow_shared = true"
            )
        tenant, shared = cores, True
    return CpuSlice(g, cores, reserved, tenant, shared)
