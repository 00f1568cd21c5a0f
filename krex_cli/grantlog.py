"""``krex run --grant-log PATH``: one JSON line per admission of the command.

Who runs ``krex run`` from another program (a cluster task,
``krex_client.cluster``) learns from it where and when krexd admitted the
command, without reading the command's environment.  Each line, appended
when ``admit`` is granted (once per run: ``--retry-tempfail`` and
``--fault-retries`` re-runs add one each)::

    {"time": <unix s of the grant>, "tenant": <int>, "gpu": <int>,
     "gpu_uuid": <str or null>, "admit_ms": <wait for the slot, ms>}

A line is one ``write(2)`` to a file opened with ``O_APPEND``
(``krex_client.logfile``): a symbolic link at the path is not followed (a
root ``krex run`` never appends to a file another user pointed it at), only
a regular file is written (opened ``O_NONBLOCK``, then checked: a FIFO or a
device put at the path would block ``krex run`` or swallow the line), a new
file is mode 0600, and a lock another process holds delays the line by at
most 0.1 s.  A failure to write is reported on stderr in one line and does
not stop the command.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from krex_client import logfile


def append(path: str, granted: Mapping[str, Any], admit_ms: float) -> None:
    """Append the grant ``granted`` (the ``admit`` reply) to ``path``; ``admit_ms``: the wait."""
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
