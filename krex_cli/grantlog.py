"""``krex run --grant-log PATH``: one JSON line per admission of the command.

A program that runs ``krex run`` (a cluster task) learns where and when
krexd admitted the command without reading its environment; the line and
how it is written safely: docs/design/interfaces.md "Several hosts (Ray)"
and :func:`append`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from krex_client import logfile


def append(path: str, granted: Mapping[str, Any], admit_ms: float) -> None:
    """Append the grant ``granted`` (the ``admit`` reply) to ``path``; ``admit_ms``: the wait.

    One line per grant (``--retry-tempfail`` and ``--fault-retries`` re-runs add
    one each)::

        {"time": <unix s of the grant>, "tenant": <int>, "gpu": <int>,
         "gpu_uuid": <str or null>, "admit_ms": <wait for the slot, ms>}

    One ``write(2)`` through ``krex_client.logfile``: no symbolic link
    followed, only a regular file written, a new file mode 0600, a lock held
    elsewhere delays the line by at most 0.1 s.  A failure to write is one
    line on stderr and does not stop the command.
    """
    env = granted.get("env") or {}
    line = {
        "time": time.time(),
        "tenant": granted.get("tenant"),
        "gpu": granted.get("gpu"),
        "gpu_uuid": env.get("KREX_GPU_UUID"),
        "admit_ms": round(admit_ms, 3),
    }
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    try:
        logfile.append_line(path, data)
    except OSError as exc:
        print(f"krex: warning: cannot write the grant log: {exc.strerror}", file=sys.stderr)
