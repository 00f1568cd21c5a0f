"""krexd.hardware.slices: computed and configured CPU slices, and the layouts refused at start."""

from __future__ import annotations

import pytest

from krexd.config.config import ConfigError, CpuConfig
from krexd.hardware.inventory import GpuInfo, fake_gpus
from krexd.hardware.slices import compute_slices


def gpus_on_nodes(*nodes: int | None) -> list[GpuInfo]:
    return [GpuInfo(i, f"g{i}", 1, 1, n, False) for i, n in enumerate(nodes)]


def test_even_split_without_topology() -> None:
    s = compute_slices(fake_gpus(2), CpuConfig(reserved_cores=1), range(8), {})
    assert s[0].cores == (0, 1, 2, 3) and s[1].cores == (4, 5, 6, 7)
    assert s[0].reserved == (3,) and s[0].tenant_cores == (0, 1, 2)
    assert not s[0].shared


def test_numa_local_cores() -> None:
    nodes = {0: tuple(range(0, 4)), 1: tuple(range(4, 8))}
    s = compute_slices(gpus_on_nodes(1, 1, 0), CpuConfig(reserved_cores=1), range(8), nodes)
    assert s[0].cores == (4, 5) and s[1].cores == (6, 7) and s[2].cores == (0, 1, 2, 3)


def test_topology_respects_allowed_cores() -> None:
    nodes = {0: tuple(range(0, 8))}
    s = compute_slices(gpus_on_nodes(0), CpuConfig(reserved_cores=2), [2, 3, 4, 5], nodes)
    assert s[0].cores == (2, 3, 4, 5) and s[0].reserved == (4, 5)


def test_configured_slices() -> None:
    cpu = CpuConfig(reserved_cores=1, slices={0: (0, 1), 1: (2, 3)})
    s = compute_slices(fake_gpus(2), cpu, range(4), {})
    assert s[1].cores == (2, 3) and s[1].reserved == (3,) and s[1].tenant_cores == (2,)


def test_overlap_is_refused() -> None:
    cpu = CpuConfig(slices={0: (0, 1), 1: (1, 2)})
    with pytest.raises(ConfigError, match="GPUs 0 and 1 overlap on cores 1"):
        compute_slices(fake_gpus(2), cpu, range(4), {})


def test_overlap_allowed_when_shared() -> None:
    cpu = CpuConfig(reserved_cores=0, allow_shared=True, slices={0: (0, 1), 1: (1, 2)})
    s = compute_slices(fake_gpus(2), cpu, range(4), {})
    assert s[0].shared and s[1].shared


def test_missing_cores_are_refused() -> None:
    cpu = CpuConfig(slices={0: (0, 9)})
    with pytest.raises(ConfigError, match="cores 9 do not exist"):
        compute_slices(fake_gpus(1), cpu, range(4), {})


def test_slice_for_unknown_gpu_is_refused() -> None:
    with pytest.raises(ConfigError, match="GPU 3 does not exist"):
        compute_slices(fake_gpus(1), CpuConfig(slices={0: (0,), 3: (1,)}), range(4), {})


def test_missing_slice_is_refused() -> None:
    with pytest.raises(ConfigError, match="no slice for GPU 1"):
        compute_slices(fake_gpus(2), CpuConfig(slices={0: (0,)}), range(4), {})


def test_empty_after_reservation_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty after reserving 1"):
        compute_slices(fake_gpus(2), CpuConfig(reserved_cores=1), range(2), {})


def test_two_cores_two_gpus_shared() -> None:
    s = compute_slices(fake_gpus(2), CpuConfig(reserved_cores=1, allow_shared=True), range(2), {})
    assert s[0].cores == (0,) and s[0].tenant_cores == (0,) and s[0].reserved == (0,)
    assert s[0].shared


def test_more_gpus_than_cores() -> None:
    with pytest.raises(ConfigError, match="only 2 core"):
        compute_slices(fake_gpus(3), CpuConfig(reserved_cores=0), range(2), {})
    s = compute_slices(fake_gpus(3), CpuConfig(reserved_cores=0, allow_shared=True), range(2), {})
    assert [s[g].cores for g in range(3)] == [(0,), (1,), (0,)]
    assert all(s[g].shared for g in range(3))


def test_reserved_zero() -> None:
    s = compute_slices(fake_gpus(1), CpuConfig(reserved_cores=0), range(2), {})
    assert s[0].reserved == () and s[0].tenant_cores == (0, 1)
