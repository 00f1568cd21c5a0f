"""``MemoryWait``: the holder's expected memory must fit beside its siblings'.

The check first runs during the drain (``GatedRegions._establish_fitting``);
when it does not fit, the entry is undone and :meth:`MemoryWait.wait` runs,
lock held (FIFO kept), bounded, while the siblings (running again) free
memory; it fails at once when the need can never fit (``RegionMemory``,
docs/design/memory.md).
"""

from __future__ import annotations

import asyncio
import time

from krexd.coordinator.isolation import RegionMemory
from krexd.coordinator.records import RegionRequest
from krexd.coordinator.scope import GpuScope, log
from krexd.system.errors import Code, KrexError
from krexd.tenancy.tenants import Tenant


class MemoryWait:
    """One GPU's memory check and wait of region entry (``RegionMemory``; None: none).

    Owns who waits now (:attr:`waiting`, a tenant id; status's
    ``memory_wait``) and how many entries waited (:attr:`waits`).
    """

    def __init__(self, scope: GpuScope, memory: RegionMemory | None) -> None:
        self._scope = scope
        self._memory = memory
        self.waiting: int | None = None  # tenant whose entry waits for memory
        self.waits = 0  # entries that waited for siblings' memory

    async def short(self, holder: Tenant) -> bool:
        """During step 3: True when the holder's expected memory does not fit now.

        Yields once first, so that the drain's task has handed ``Gate.drain``
        to the executor before the check runs on the loop (the thread then
        runs whenever a worker and the GIL are free).
        """
        await asyncio.sleep(0)
        if self._memory is None:
            return False
        fit = self._memory.check(holder, self._scope.siblings(holder))
        return fit is not None and not fit.fits

    async def wait(self, holder: Tenant, request: RegionRequest) -> None:
        """With the lock held (FIFO kept), gate open: the holder's expected memory
        must fit in what its siblings leave free, or the region would begin into an
        out-of-memory error its frozen siblings cause.

        Waits up to ``RegionMemory.wait_s`` seconds for the siblings (still
        running) to free memory, polling every 20 ms, then proceeds: the
        expectation is an estimate, and an error inside the region is
        attributed to the co-tenants anyway (exit 75).

        Raises:
            KrexError: REGION_NO_MEMORY at once when the need exceeds what the
                card can ever give it; CANCELLED when ``request`` is cancelled
                (the tenant gives up or ends).
        """
        memory, scope = self._memory, self._scope
        if memory is None:
            return
        fit = memory.check(holder, scope.siblings(holder))
        if fit is None or fit.fits:
            return
        deadline = time.monotonic() + memory.wait_s
        self.waiting = holder.id
        self.waits += 1
        try:
            while fit is not None and not fit.fits:
                if fit.never:
                    raise KrexError(
                        Code.REGION_NO_MEMORY,
                        f"GPU {scope.gpu}: tenant {holder.id} expects {_gib(fit.need)} in its "
                        f"region, more than the {_gib(fit.total - fit.other)} the card can give "
                        f"it ({_gib(fit.total)} total, {_gib(fit.other)} held by processes krex "
                        "does not run)",
                    )
                if request.cancelled:
                    raise KrexError(Code.CANCELLED, f"tenant {holder.id} cancelled its region")
                if time.monotonic() >= deadline:
                    log.warning(
                        "GPU %d: tenant %d enters its region expecting %s while its siblings "
                        "leave %s free (waited %g s)",
                        scope.gpu,
                        holder.id,
                        _gib(fit.need),
                        _gib(fit.free),
                        memory.wait_s,
                    )
                    return
                await asyncio.sleep(0.02)
                fit = memory.check(holder, scope.siblings(holder))
        finally:
            self.waiting = None


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"
