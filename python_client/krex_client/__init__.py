"""krex_client: what a benchmarking command uses inside krex.

``region.critical()``, ``testing.do_bench`` / ``do_bench_cudagraph`` /
``time_trials``, ``do_bench`` and ``autoregion()`` (python_client/README.md
"Use"); all work as no-ops with one warning off krex.  Importing this
package needs no GPU, krexd, pyzmq or PyTorch: submodules load on first
use, pyzmq and msgpack at the first region, PyTorch at the first measurement.
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
