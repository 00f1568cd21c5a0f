"""A tenant that only reports its credentials, then sleeps until killed.

Prints one JSON line ``{"tenant", "token", "pid", "tid"}`` so a test can
speak the control protocol as this tenant (and as nobody else).
"""

from __future__ import annotations

import json
import os
import threading
import time

print(
    json.dumps(
        {
            "tenant": int(os.environ["KREX_TENANT"]),
            "token": os.environ["KREX_TOKEN"],
            "pid": os.getpid(),
            "tid": threading.get_native_id(),
        }
    ),
    flush=True,
)
while True:
    time.sleep(1)
