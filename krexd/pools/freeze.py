"""Warm pools stand still during every region (docs/design/warm.md "Regions: pools stand still").

One ``cgroup.freeze`` of krexd's ``pools`` directory, asked as a region's
gate closes and released as it ends; regions of several GPUs share it (a
count).  Its files stay open between regions (``krexd.system.heldfiles``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from krexd.cgroups import fs
from krexd.cgroups.fs import CgroupError
from krexd.system.heldfiles import HeldFile

_log = logging.getLogger("krexd.pools")


class PoolFreeze:
    """Freeze of the ``pools`` directory ``path`` (cgroup v2), shared by every GPU's regions."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.holders = 0
        self._freeze = HeldFile(os.path.join(path, "cgroup.freeze"), write=True)
        self._events = HeldFile(os.path.join(path, "cgroup.events"), one_record=True)

    def reset(self) -> None:
        """At start: thaw what a killed krexd may have left frozen."""
        self._write("0")

    def begin(self) -> None:
        """Count one region's hold and ask the kernel to freeze the pools (the first
        hold writes ``cgroup.freeze``); release it with :meth:`release`."""
        self.holders += 1
        if self.holders == 1:
            self._write("1")  # False: no pools directory, nothing can run there

    async def wait_frozen(self, timeout_s: float) -> bool:
        """Wait until the kernel reports the pools frozen (held by :meth:`begin`);
        False after ``timeout_s`` seconds.  The hold stays counted either way."""
        deadline = time.monotonic() + timeout_s
        delay = 50e-6
        while not self._frozen():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5e-3)
        return True

    def hold_now(self) -> bool:
        """Freeze the pools for one region without waiting (an adopted region, at start).

        Returns True: the hold is counted (release it with :meth:`release`);
        the kernel completes the freeze on its own.
        """
        self.begin()
        return True

    def release(self) -> None:
        """End one region's hold; the last one thaws the pools."""
        if self.holders == 0:
            return
        self.holders -= 1
        if self.holders == 0:
            self._write("0")

    def close(self) -> None:
        """Close the held control files (at krexd's stop; a later use opens them again)."""
        self._freeze.close()
        self._events.close()

    def _write(self, value: str) -> bool:
        try:
            fs.write(self._freeze, value)
        except (CgroupError, OSError) as exc:
            if os.path.isdir(self.path):
                _log.error("cannot write %s/cgroup.freeze = %s: %s", self.path, value, exc)
            return False
        return True

    def _frozen(self) -> bool:
        try:
            return fs.events(self._events).get("frozen", 0) == 1
        except (CgroupError, OSError):
            return True  # gone: nothing left to run
