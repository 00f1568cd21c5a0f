"""``make demo`` / ``python -m krexd.demo``: krexd with the shipped config and a few commands.

Starts ``krexd --foreground`` with ``etc/krex.toml`` on a private socket
(``--fake-gpus 1`` when this host has no GPU, and says so), runs more
commands through ``krex run`` than there are slots so some are parked,
shows ``krexctl status`` while they run, then stops krexd.  Needs root
(krexd manages cgroups).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from krex_client.connection import Connection, KrexUnavailable
from krexd import gpus, paths

REPO = Path(__file__).resolve().parent.parent
COMMANDS = 6
# Each command reports where krex put it, then works for a moment.
PROG = (
    "import os, time\n"
    "cg = [l for l in open('/proc/self/cgroup') if l.startswith('0::')][0].strip()[3:]\n"
    "cpus = sorted(os.sched_getaffinity(0))\n"
    "print(f\"  command {os.environ['DEMO_N']}: tenant {os.environ['KREX_TENANT']} on GPU "
    "{os.environ['KREX_GPU']}, cgroup {cg}, cores {cpus}\", flush=True)\n"
    "time.sleep(1.5)\n"
)


def say(msg: str) -> None:
    print(f"demo: {msg}", flush=True)


def wait_ready(proc: subprocess.Popen[bytes], socket: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"demo: krexd exited with {proc.returncode}")
        if os.path.exists(socket):
            try:
                with Connection(socket, timeout_s=0.5) as c:
                    c.request("ping")
                return
            except KrexUnavailable:
                pass
        time.sleep(0.05)
    raise SystemExit("demo: krexd did not become ready")


def main() -> int:
    """Run the demo; returns 0 when every command succeeded."""
    if os.geteuid() != 0:
        say("krexd manages cgroups and must run as root: sudo make demo")
        return 77
    found = gpus.discover(0)
    args: list[str] = []
    if found:
        say(f"GPUs found: {', '.join(g.name for g in found)}")
    else:
        say("no GPU on this host: krexd runs with --fake-gpus 1 (simulated GPU)")
        args = ["--fake-gpus", "1"]
    workdir = tempfile.mkdtemp(prefix="krex-demo-")
    os.chmod(workdir, 0o755)
    socket = os.path.join(workdir, "krexd.sock")
    config = REPO / "etc" / "krex.toml"
    env = dict(os.environ, KREX_SOCKET=socket)
    fake = paths.fake_driver_dir()
    if not found and fake:
        say(f"commands load the fake CUDA driver from {fake}")
        env["LD_LIBRARY_PATH"] = (
            f"{fake}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else fake
        )
    cmd = [
        sys.executable,
        "-m",
        "krexd",
        "--foreground",
        "--config",
        str(config),
        "--socket",
        socket,
        *args,
    ]
    say(f"starting: {' '.join(cmd)}")
    log = open(os.path.join(workdir, "krexd.log"), "wb")  # noqa: SIM115
    krexd = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    codes: list[int] = []
    try:
        wait_ready(krexd, socket)
        say(f"krexd ready on {socket}; running {COMMANDS} commands through krex run")
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "krexd.cli.krex", "run", "--", sys.executable, "-c", PROG],
                env=dict(env, DEMO_N=str(i)),
            )
            for i in range(1, COMMANDS + 1)
        ]
        time.sleep(0.8)
        say("krexctl status while they run:")
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from krexd.cli.krexctl import main; sys.exit(main())",
                "status",
            ],
            env=env,
            check=False,
        )
        codes = [r.wait() for r in runs]
        say(f"exit codes: {codes}")
    finally:
        krexd.terminate()
        krexd.wait(30)
        log.close()
        say(f"krexd stopped (exit {krexd.returncode}); its log: {workdir}/krexd.log")
    return 0 if codes and all(c == 0 for c in codes) and krexd.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
