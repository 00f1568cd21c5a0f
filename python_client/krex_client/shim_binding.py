"""ctypes binding of libkrex_shim.so's holder-side entry points (``krex_shim_region_*``).

Resolved in the process itself (``dlopen(NULL)``): present when ``krex run``
preloaded the shim, each one None otherwise, and every method then does
nothing and says so (no flush, no launches, no events).  The C side is
``libkrex_shim/tenant/region.c``; :mod:`krex_client.region` calls these at entry
(step 5: the L2 flush) and exit (step 7: the holder's synchronization).
"""

from __future__ import annotations

import ctypes
from typing import Any


class Shim:
    """The holder-side entry points of libkrex_shim.so, when it is preloaded."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(None)
        self.begin: Any = getattr(lib, "krex_shim_region_begin", None)
        self.end: Any = getattr(lib, "krex_shim_region_end", None)
        self.flushed: Any = getattr(lib, "krex_shim_region_l2_flushed", None)
        if self.flushed is not None:
            self.flushed.argtypes = []
            self.flushed.restype = ctypes.c_int
        if self.begin is not None:
            self.begin.argtypes = [ctypes.c_uint32, ctypes.c_int]
            self.begin.restype = ctypes.c_int
        if self.end is not None:
            self.end.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
            self.end.restype = ctypes.c_int
        self.other: Any = getattr(lib, "krex_shim_region_other_streams_ns", None)
        if self.other is not None:
            self.other.argtypes = []
            self.other.restype = ctypes.c_uint64
        self.outside: Any = getattr(lib, "krex_shim_region_events_outside", None)
        if self.outside is not None:
            self.outside.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 2
            self.outside.restype = ctypes.c_int
        self.warm: Any = getattr(lib, "krex_shim_region_warm", None)
        if self.warm is not None:
            self.warm.argtypes = [ctypes.c_uint32]
            self.warm.restype = ctypes.c_int
        self._launches: Any = getattr(lib, "krex_shim_region_launches", None)
        if self._launches is not None:
            self._launches.argtypes = []
            self._launches.restype = ctypes.c_uint64

    def launches(self) -> int | None:
        """Launches since the last ``region_begin`` so far; None without the shim."""
        return None if self._launches is None else int(self._launches())

    def region_begin(self, epoch: int, l2_flush: bool) -> bool:
        """Step 5, holder side: flush L2 in the current context (paper §4.2).

        Returns whether L2 was actually flushed (the shim may have had no
        context, an open capture or no memory for the buffer); raises
        krex_client.region.RegionError when the flush failed.
        """
        if self.begin is None:
            return False
        rc = self.begin(epoch, 1 if l2_flush else 0)
        if rc != 0:
            # Raised as the region's own error; krex_client.region made this binding
            # and is loaded (imported here, not above: region imports this module).
            from krex_client.region import RegionError

            raise RegionError(f"L2 flush at region entry failed (CUresult {rc})")
        return self.flushed is not None and bool(self.flushed())

    def region_end(self) -> tuple[float, int]:
        """Step 7, holder side: synchronize own contexts; (sync ms, launches in region)."""
        if self.end is None:
            return 0.0, 0
        sync_ns = ctypes.c_uint64(0)
        launches = ctypes.c_uint64(0)
        self.end(ctypes.byref(sync_ns), ctypes.byref(launches))
        return sync_ns.value / 1e6, int(launches.value)

    def other_streams_ms(self) -> float | None:
        """Device time (ms) of work left on streams other than the timed one at the
        last ``region_end``; None when unknown (no event recorded in the region)."""
        ns = int(self.other()) if self.other is not None else 2**64 - 1
        return None if ns == 2**64 - 1 else ns / 1e6

    def events_outside(self) -> tuple[int, int]:
        """CUDA events (recorded, timed) outside any region in this process so far."""
        if self.outside is None:
            return 0, 0
        rec, timed = ctypes.c_uint64(0), ctypes.c_uint64(0)
        self.outside(ctypes.byref(rec), ctypes.byref(timed))
        return int(rec.value), int(timed.value)
