"""``krex run --grant-log PATH``: one JSON line per admission of the command.

Who runs ``krex run`` from another program (a cluster task,
``krex_client.cluster``) learns from it where and when krexd admitted the
command, without reading the command's environment.  Each line, appended
when ``admit`` is granted (once per run: ``--retry-tempfail`` and
``--fault-retries`` re-runs add one each)::

    {"time": <unix s of the grant>, "tenant": <int>, "gpu": <int>,
     "gpu_uuid": <str or null>, "admit_ms": <wait for the slot, ms>}

A line is one ``write(2)`` to a file opened with ``O_APPEND``.  Only a
regular file is written (opened ``O_NONBLOCK``, then checked): a FIFO or a
device put at the path, by the command itself between two admissions, say,
would block ``krex run`` or swallow the line.  A failure to write is
reported on stderr and does not stop the command.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Mapping
from typing import Any


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
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(path, flags, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        print(f"krex: warning: cannot write the grant log {path}: {exc}", file=sys.stderr)
