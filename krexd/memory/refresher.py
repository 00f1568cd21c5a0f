"""The periodic memory read: every ``[memory] refresh_ms``, each GPU's device source.

Each read goes to the GPUs' views (``krexd.memory.views``) and, first, to
whoever watches which processes use a GPU (the warm pools: a pool on the GPU
or over its tasks ends).  While requests are parked, admission is asked to
dispatch again after each read: memory can come back without a slot being
released.  The source (``krexd.memory.opening``) is read in a worker thread;
a failing read is logged once per distinct error and the loop goes on.  The
loop ends when krexd stops serving, and closes the source.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from krex_client.sizes import format_size
from krexd.config.config import MemoryConfig
from krexd.memory.sources import DeviceMemory, Source
from krexd.memory.views import MemoryViews
from krexd.system.errors import KrexError
from krexd.system.runtime import Runtime
from krexd.tenancy.admission import Waiter

_log = logging.getLogger("krexd.memory")


class Parked(Protocol):
    """What the refresh asks of admission (``krexd.tenancy.admission.Admission``)."""

    @property
    def parked(self) -> list[Waiter]: ...

    def kick(self) -> None: ...


class MemoryRefresh:
    """Reads ``source`` into ``views`` every ``cfg.refresh_ms`` once :meth:`start` ran.

    Args:
        cfg: the ``[memory]`` table (``refresh_ms``; the rest is logged at start).
        source: the GPUs' device source, opened; closed when the loop ends
            (:meth:`close`).
        views: the GPUs' memory views, given each read.
        admission: kicked after a read while requests are parked.
        runtime: runs the loop; it ends once krexd stops serving.
        on_gpu_users: told the pids each read saw with GPU memory (the warm
            pools' watch, ``krexd.pools.registry.PoolRegistry.after_device_read``;
            None: nobody).  What it raises is logged, never stops the read.
    """

    def __init__(
        self,
        cfg: MemoryConfig,
        source: Source,
        views: MemoryViews,
        admission: Parked,
        runtime: Runtime,
        on_gpu_users: Callable[[set[int]], None] | None = None,
    ) -> None:
        self._cfg = cfg
        self.source = source
        self._views = views
        self._admission = admission
        self._runtime = runtime
        self._on_gpu_users = on_gpu_users
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Read every GPU once now (a failure is logged), then refresh in the background
        (once: a second call does nothing)."""
        if self._task is not None:
            return
        try:
            self._apply(self.source.read())
        except Exception:
            _log.exception("first memory refresh failed")
        cfg = self._cfg
        _log.info(
            "memory: source %s, admission %s, default need %s, headroom %s, oom wait %g s",
            self.source.name,
            "on" if cfg.admission else "off",
            format_size(cfg.default_need),
            format_size(cfg.headroom),
            cfg.oom_wait_s,
        )
        self._task = self._runtime.spawn(self._loop())

    def close(self) -> None:
        """Release the source (the gates are the daemon's: it unmaps them)."""
        self.source.close()

    async def _loop(self) -> None:
        period = self._cfg.refresh_ms / 1000
        failed = ""
        source = self.source
        try:
            while True:
                try:
                    self._runtime.check_serving()
                except KrexError:
                    return
                try:
                    self._apply(await asyncio.to_thread(source.read))
                    failed = ""
                except Exception as exc:
                    if repr(exc) != failed:  # once per distinct error, not every refresh
                        _log.exception("memory refresh failed")
                    failed = repr(exc)
                if self._admission.parked:
                    self._admission.kick()  # memory may have come back
                await asyncio.sleep(period)
        finally:
            self.close()

    def _apply(self, dev: dict[int, DeviceMemory]) -> None:
        """A fresh read of every GPU's source: tell :attr:`on_gpu_users` (the warm pools'
        watch) which processes it saw, then recompute each view."""
        if self._on_gpu_users is not None:
            seen = {pid for d in dev.values() for pid in (*d.listed, *(d.per_pid or {}))}
            try:
                if seen:
                    self._on_gpu_users(seen)
            except Exception:  # the watch must not cost the refresh
                _log.exception("warm pools' GPU watch failed")
        self._views.apply(dev)
