"""Who has a GPU open now: the fail-closed check's source (``registrations.RegionGuard``).

Read afresh from the GPUs' device source (``krexd.memory.opening``: NVML's or
amdsmi's process list, the fake driver's state) at each question, never
from the periodic memory read: a region entry asks only when some sibling
process is not a verified registrant, and must see who opened the GPU since.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from krexd.memory.sources import Source

_log = logging.getLogger("krexd.memory")


class GpuUsers:
    """The pids with a context on each GPU, from ``source`` (shared with the memory refresh)."""

    def __init__(self, source: Source) -> None:
        self._source = source

    def users(self, gpu: int) -> set[int] | None:
        """Pids with a context on GPU ``gpu`` now, read afresh; None when the source
        cannot tell or its read fails (logged as a warning, never raised)."""
        try:
            return self._source.users(gpu)
        except Exception as exc:
            _log.warning("gpu%d: who has the GPU open: %s", gpu, exc)
            return None

    def of(self, gpu: int) -> UsersOfGpu:
        """The question for GPU ``gpu`` alone: what one GPU's ``RegionGuard`` asks."""
        return UsersOfGpu(self, gpu)


@dataclass(frozen=True)
class UsersOfGpu:
    """Who has GPU ``gpu`` open, asked by calling it (``GpuUsers.users(gpu)``)."""

    gpus: GpuUsers
    gpu: int

    def __call__(self) -> set[int] | None:
        """Pids with a context on the GPU now (None: unknown)."""
        return self.gpus.users(self.gpu)
