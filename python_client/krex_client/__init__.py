"""krex_client: what a benchmarking command uses inside krex.

``from krex_client import region`` then ``with region.critical(): ...`` marks a
critical region (paper §4.1); ``krex_client.do_bench(fn, warmup_ms=25,
rep_ms=100)`` times ``fn`` inside one (median, ms).  Both work, as no-ops with
one warning, when the command does not run under krex.

Importing this package needs no GPU and no krexd: submodules load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["region", "do_bench"]


def __getattr__(name: str) -> Any:
    # Lazy: ``region`` and ``bench`` pull in ctypes/zmq only when used.
    if name == "region":
        return importlib.import_module("krex_client.region")
    if name == "do_bench":
        return importlib.import_module("krex_client.bench").do_bench
    raise AttributeError(f"module 'krex_client' has no attribute {name!r}")
