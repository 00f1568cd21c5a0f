"""A stand-in for ``krex`` in the cluster task's tests: ``run [options] -- CMD``.

Arms ``--die-with PID`` as krex run does (``krex_cli.parentdeath``), writes its
own pid to ``$FAKE_KREX_PIDFILE`` (when set), one grant line to
``--grant-log`` (tenant 7, GPU 1) and one region record to ``--region-log``,
then runs CMD (which dies with it: krexd would kill it) and exits with its
code.  ``FAKE_KREX_DEAF=1``: ignores SIGTERM (as a ``krex run`` whose command
ignores it would wait).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from krex_cli import parentdeath


def main() -> int:
    args = sys.argv[1:]
    assert args[0] == "run", args
    cut = args.index("--")
    opts, cmd = args[1:cut], args[cut + 1 :]
    logs = {opts[i]: opts[i + 1] for i in range(len(opts) - 1) if opts[i].endswith("-log")}
    if "--die-with" in opts and not parentdeath.arm(int(opts[opts.index("--die-with") + 1])):
        return 2
    if os.environ.get("FAKE_KREX_DEAF") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_KREX_PIDFILE"):
        with open(os.environ["FAKE_KREX_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    grant = {"time": time.time(), "tenant": 7, "gpu": 1, "gpu_uuid": "GPU-x", "admit_ms": 12.5}
    with open(logs["--grant-log"], "a") as f:
        f.write(json.dumps(grant) + "\n")
    if "--region-log" in logs:
        with open(logs["--region-log"], "a") as f:
            f.write(json.dumps({"v": 1, "tenant": 7, "region_ms": 1.5, "opts": opts}) + "\n")
            f.write("not json\n")
    prctl = ctypes.CDLL(None).prctl
    return subprocess.run(cmd, preexec_fn=lambda: prctl(1, signal.SIGKILL, 0, 0, 0)).returncode


if __name__ == "__main__":
    sys.exit(main())
