"""Control-plane ops: one module per op, its docstring is the protocol.

``OPS`` maps the ``op`` string of a request to ``handle(daemon, req) -> body``.
Region ops (``region_enter``/``region_exit``) are listed when their modules
are present.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import admit, memory, ping, place, release, status

if TYPE_CHECKING:
    from krexd.daemon import Daemon

Handler = Callable[["Daemon", Request], Awaitable[dict[str, Any]]]

OPS: dict[str, Handler] = {
    "ping": ping.handle,
    "status": status.handle,
    "admit": admit.handle,
    "place": place.handle,
    "release": release.handle,
    "memory": memory.handle,
}

for _op in ("region_enter", "region_exit"):
    if importlib.util.find_spec(f"krexd.control.{_op}") is not None:
        OPS[_op] = importlib.import_module(f"krexd.control.{_op}").handle
