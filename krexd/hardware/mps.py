"""NVIDIA MPS control daemons, one per GPU, started and stopped by krexd.

With ``[mps] enabled = true`` kernels of concurrent commands share the GPU
instead of being time-sliced between contexts (paper §6.5: +24 % on the
H20 at concurrency 16); :class:`MpsManager` runs each GPU's daemon.
GPU-wide faults under MPS: docs/design/faults.md.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

_log = logging.getLogger("krexd.mps")

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


class MpsError(RuntimeError):
    """An MPS control daemon could not be started."""


@dataclass
class MpsDaemon:
    """The MPS control daemon of one GPU: its folders and the env tenants need."""

    gpu: int
    pipe_dir: str
    log_dir: str

    def tenant_env(self) -> dict[str, str]:
        """Variables a tenant of this GPU needs to reach this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def _env(self, gpu_uuid_or_index: str) -> dict[str, str]:
        env = dict(os.environ)
        for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LD_PRELOAD"):
            env.pop(var, None)
        env.update(
            self.tenant_env(),
            CUDA_VISIBLE_DEVICES=gpu_uuid_or_index,
            CUDA_DEVICE_ORDER="PCI_BUS_ID",  # an index then means NVML's (PCI bus) order
        )
        return env


class MpsManager:
    """Start and stop the MPS control daemon of a GPU (each lives on its ``Gpu``).

    krexd starts ``nvidia-cuda-mps-control -d`` for each GPU with
    ``CUDA_VISIBLE_DEVICES`` set to that GPU and private pipe and log folders
    under the state directory, gives tenants of that GPU the same
    ``CUDA_MPS_PIPE_DIRECTORY``, and always stops the daemons at shutdown
    (``quit`` on the control pipe, then SIGKILL of what is left).  The freezer
    is unchanged: drained and frozen MPS clients hold no work on the GPU.

    Args:
        control: the control program (``nvidia-cuda-mps-control``, or a path).
        state_dir: krexd's state directory; folders ``mps-gpu<N>/{pipe,log}``
            are made below it (mode 0755; the pipes must be reachable by
            tenants).
    """

    def __init__(self, control: str, state_dir: str) -> None:
        self.control = control
        self.state_dir = state_dir

    def start(self, gpu: int, uuid: str = "") -> MpsDaemon:
        """Start the control daemon of GPU ``gpu`` (UUID ``uuid`` when known), wait for its pipe.

        A daemon already answering on this GPU's pipe (left by a krexd that
        exited for a restart, with its clients running) is adopted instead;
        a pipe nobody reads is removed first.

        Raises:
            MpsError: the control program is missing, fails, or its pipe does
                not appear within 10 s.
        """
        exe = shutil.which(self.control)
        if exe is None:
            raise MpsError(f"[mps] control: {self.control!r} not found")
        base = os.path.join(self.state_dir, f"mps-gpu{gpu}")
        d = MpsDaemon(gpu, os.path.join(base, "pipe"), os.path.join(base, "log"))
        for path in (d.pipe_dir, d.log_dir):
            os.makedirs(path, mode=0o755, exist_ok=True)
        control_pipe = os.path.join(d.pipe_dir, "control")
        if os.path.exists(control_pipe):
            # A krexd restart leaves the daemon serving its running clients: adopt it.
            if self._answers(exe, d, uuid):
                _log.info("GPU %d: MPS control daemon of the krexd before adopted", gpu)
                return d
            os.unlink(control_pipe)  # stale: nothing reads it
        run = subprocess.run(
            [exe, "-d"], env=d._env(uuid or str(gpu)), capture_output=True, timeout=_START_TIMEOUT_S
        )
        if run.returncode != 0:
            raise MpsError(f"GPU {gpu}: {exe} -d failed: {run.stderr.decode().strip()}")
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not os.path.exists(control_pipe):
            if time.monotonic() > deadline:
                self.stop(d)
                raise MpsError(f"GPU {gpu}: MPS control pipe {control_pipe} did not appear")
            time.sleep(0.02)
        _log.info("GPU %d: MPS control daemon started (pipes in %s)", gpu, d.pipe_dir)
        return d

    @staticmethod
    def _answers(exe: str, d: MpsDaemon, uuid: str) -> bool:
        """True when a control daemon answers on ``d``'s pipe (``get_server_list``, 2 s)."""
        try:
            rc = _send(exe, b"get_server_list\n", d._env(uuid or str(d.gpu)), 2.0)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return rc == 0

    def stop(self, d: MpsDaemon) -> None:
        """Quit the control daemon ``d`` (it stops its server), then kill leftovers."""
        exe = shutil.which(self.control) or self.control
        try:
            _send(exe, b"quit\n", d._env(str(d.gpu)), _STOP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _log.error("GPU %d: MPS quit failed: %s", d.gpu, exc)
        self._kill_leftovers(d)
        _log.info("GPU %d: MPS control daemon stopped", d.gpu)

    @staticmethod
    def _kill_leftovers(d: MpsDaemon) -> None:
        """SIGKILL processes still using this daemon's pipe folder (after a failed quit)."""
        import psutil

        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while True:
            left = [
                p
                for p in psutil.process_iter(["environ"])
                if (p.info.get("environ") or {}).get("CUDA_MPS_PIPE_DIRECTORY") == d.pipe_dir
                and p.pid != os.getpid()
            ]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for p in left:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _send(exe: str, command: bytes, env: dict[str, str], timeout_s: float) -> int:
    """Run the control program with ``command`` on stdin; its exit code.

    In a session of its own, and on timeout the whole session is killed: a
    client stuck opening a pipe nobody reads may be a child of the program
    (the stand-in's shell), which killing the program alone would leave
    blocked, holding the pipe folder, until krexd stops.

    Raises:
        OSError: the program cannot start.
        subprocess.TimeoutExpired: no answer within ``timeout_s`` seconds.
    """
    p = subprocess.Popen(
        [exe],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        p.communicate(command, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        raise
    return p.returncode
