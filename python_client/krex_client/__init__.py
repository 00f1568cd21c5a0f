"""krex_client: what a benchmarking command uses inside krex.

* ``from krex_client import region`` then ``with region.critical(): ...``
  marks a critical region (paper §4.1);
* ``krex_client.testing.do_bench`` / ``do_bench_cudagraph`` are
  ``triton.testing``'s, each run in one region; ``time_trials`` is
  KernelBench's loop;
* ``krex_client.do_bench(fn, warmup_ms=25, rep_ms=100)`` times ``fn`` in one
  region (median, ms);
* ``krex_client.autoregion()`` (or ``KREX_AUTOREGION=1``) runs Triton's and
  PyTorch's benchmarking calls in regions without code changes.

All of it works, as no-ops with one warning, when the command does not run
under krex.  Importing this package needs no GPU, no krexd, no pyzmq and no
PyTorch: submodules load on first use, pyzmq and msgpack on the first region
under krex, PyTorch at the first measurement.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"
"""The krex release this client belongs to (the krex-client distribution's version)."""

__all__ = ["region", "do_bench", "testing", "autoregion", "__version__"]

_LAZY = {
    "region": ("krex_client.region", None),
    "testing": ("krex_client.testing", None),
    "do_bench": ("krex_client.bench", "do_bench"),
    "autoregion": ("krex_client.implicit", "autoregion"),
}


def __getattr__(name: str) -> Any:
    # Lazy: ``region`` pulls in ctypes (and zmq under krex), ``testing`` PyTorch when timing.
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'krex_client' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)


# KREX_AUTOREGION=1 also takes effect here, for installs without the .pth file
# (the variable is read before importing anything, to keep this import light).
if os.environ.get("KREX_AUTOREGION", "0").strip() not in ("", "0"):
    from krex_client.implicit import activate_from_env

    activate_from_env()
