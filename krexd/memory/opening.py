"""Which source each GPU's memory is read from: by vendor, one source per vendor.

A host with GPUs of both vendors reads each through its own source behind
one :class:`SplitSource` (named ``nvml+amdsmi``), so the memory refresh
and the fail-closed check ask one object; the choice: :func:`open_source`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from krexd.hardware.inventory import AMD, NVIDIA, GpuInfo
from krexd.memory.amd_source import AmdSmiSource
from krexd.memory.sources import DeviceMemory, FakeStateSource, NoSource, NvmlSource, Source

_log = logging.getLogger("krexd.memory")

#: Each vendor's device source (raises when unavailable).
OPENERS: dict[str, Callable[[list[GpuInfo]], Source]] = {NVIDIA: NvmlSource, AMD: AmdSmiSource}


class SplitSource:
    """Several sources, each for its own GPUs (by index), read as one."""

    def __init__(self, parts: list[tuple[Source, list[int]]]) -> None:
        self._parts = parts
        self._by_gpu = {i: src for src, indices in parts for i in indices}
        self.name = "+".join(src.name for src, _ in parts)

    def read(self) -> dict[int, DeviceMemory]:
        """GPU index -> its memory now, from its own source."""
        out: dict[int, DeviceMemory] = {}
        for src, _ in self._parts:
            out.update(src.read())
        return out

    def users(self, gpu: int) -> set[int] | None:
        """Pids with a context on ``gpu``, from its source (None for an unknown GPU)."""
        src = self._by_gpu.get(gpu)
        return src.users(gpu) if src is not None else None

    def close(self) -> None:
        """Close every part."""
        for src, _ in self._parts:
            src.close()


def _open_vendor(vendor: str, gpus: list[GpuInfo]) -> Source:
    """``vendor``'s source for ``gpus``, else NoSource (logged)."""
    try:
        return OPENERS[vendor](gpus)
    except Exception as exc:  # RuntimeError of the sources, or a library error from a handle
        _log.warning("GPU memory: %s; using the shim's per-process counts", exc)
        return NoSource(gpus)


def open_source(gpus: list[GpuInfo]) -> Source:
    """The source for ``gpus``.

    Simulated GPUs (all of them, ``--fake-gpus``): the fake driver's state
    (``FakeStateSource``), whatever their vendor; NVIDIA GPUs: NVML
    (``NvmlSource``); AMD GPUs: amdsmi (``AmdSmiSource``); a vendor's source
    that cannot be opened: a warning, and the inventory's totals with the
    shim's counts for its GPUs (``NoSource``)."""
    if gpus and all(g.fake for g in gpus):
        return FakeStateSource(gpus)
    by_vendor: dict[str, list[GpuInfo]] = {}
    for g in gpus:
        by_vendor.setdefault(g.vendor, []).append(g)
    if not by_vendor:
        return NoSource(gpus)
    parts = [(_open_vendor(v, infos), [g.index for g in infos]) for v, infos in by_vendor.items()]
    return parts[0][0] if len(parts) == 1 else SplitSource(parts)
