"""GPU memory as ``status`` reports it: each GPU's memory, and the ``[memory]`` settings.

Read, never written: each GPU's view (``krexd.memory.views``, its shim counts
re-read first), what admission reserved there (``GpuSlots.mem_reserved``)
and what the admission policy (``krexd.memory.policy``) says it may still
give and whether it admits at all.  The fields are documented with the
``status`` op (docs/design/interfaces.md "Control plane").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from krexd.config.config import MemoryConfig
from krexd.memory.learned import LearnedNeeds
from krexd.memory.policy import AdmissionPolicy
from krexd.memory.sources import Source
from krexd.memory.views import MemoryViews
from krexd.tenancy.admission import GpuSlots


class MemoryStatus:
    """The memory parts of ``status`` (and the metrics' count of learned labels).

    Args:
        cfg: the ``[memory]`` table.
        views: the GPUs' memory views.
        policy: the admission policy (what may still be reserved, blocked GPUs).
        slots: each GPU's admission slots, by index (memory reserved).
        source: the device source (its name).
        learned: the learned needs (their status).
    """

    def __init__(
        self,
        cfg: MemoryConfig,
        views: MemoryViews,
        policy: AdmissionPolicy,
        slots: Mapping[int, GpuSlots],
        source: Source,
        learned: LearnedNeeds,
    ) -> None:
        self._cfg = cfg
        self._views = views
        self._policy = policy
        self._slots = slots
        self._source = source
        self._learned = learned

    def gpu_status(self, gpu: int) -> dict[str, Any] | None:
        """JSON-ready memory of ``gpu`` for ``krexctl status`` (bytes), from its shim
        counts read now; None before the first device read or for an unknown GPU."""
        self._views.refresh(gpu)
        view = self._views.view(gpu)
        if view is None:
            return None
        reserved = self._slots[gpu].mem_reserved
        avail = self._policy.available(gpu)
        return {
            "source": view.source,
            "total_bytes": view.total,
            "used_bytes": view.used,
            "free_bytes": max(0, view.total - view.used),
            "tenants_bytes": view.tenants_used,
            "other_bytes": view.other,
            "reserved_bytes": reserved,
            "headroom_bytes": self._cfg.headroom,
            "available_bytes": None if avail is None else max(0, avail - reserved),
            "waiting": sorted(view.waiting),
            "blocked": self._policy.blocked(gpu),
        }

    def settings(self) -> dict[str, Any]:
        """The ``[memory]`` settings in force, the source's name and the learned needs'
        status (``status``'s ``memory``)."""
        cfg = self._cfg
        return {
            "admission": cfg.admission,
            "default_need_bytes": cfg.default_need,
            "headroom_bytes": cfg.headroom,
            "max_bypass": cfg.max_bypass,
            "oom_wait_s": cfg.oom_wait_s,
            "refresh_ms": cfg.refresh_ms,
            "source": self._source.name,
            "learn": cfg.learn,
            "learned": self._learned.status(),
            "region_wait_s": cfg.region_wait_s,
            "retry_tempfail": cfg.retry_tempfail,
        }

    def learned_labels(self) -> int:
        """How many labels have a learned need (the metrics' gauge)."""
        return len(self._learned)
