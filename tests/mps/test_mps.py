"""MPS control daemons: one per GPU, private folders, always stopped.

Uses a stand-in control program with nvidia-cuda-mps-control's contract
(``-d`` starts a daemon serving a control pipe; ``quit`` on stdin stops it)
so the lifecycle is tested without a GPU; the real one runs on GPU hosts.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from krexd.hardware.mps import MpsError, MpsManager

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake-mps-control")


def _daemons(pipe_dir: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info.get("environ") or {}).get("CUDA_MPS_PIPE_DIRECTORY") == pipe_dir:
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_one_daemon_per_gpu_started_and_stopped(tmp_path: object) -> None:
    mgr = MpsManager(FAKE, str(tmp_path))
    daemons = [mgr.start(0)]
    try:
        daemons.append(mgr.start(1))
        for gpu in (0, 1):
            env = daemons[gpu].tenant_env()
            pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
            assert pipe.endswith(f"mps-gpu{gpu}/pipe")
            assert os.path.exists(os.path.join(pipe, "control"))
            assert _daemons(pipe), "no control daemon process"
            started = open(os.path.join(env["CUDA_MPS_LOG_DIRECTORY"], "started")).read()
            assert started.strip() == f"started for GPU {gpu}"
    finally:
        for d in daemons:
            mgr.stop(d)
    for gpu in (0, 1):
        pipe = os.path.join(str(tmp_path), f"mps-gpu{gpu}", "pipe")
        deadline = time.monotonic() + 5
        while _daemons(pipe) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _daemons(pipe), "MPS control daemon left running"
        assert not os.path.exists(os.path.join(pipe, "control"))


def test_a_restarted_krexd_adopts_the_running_daemon(tmp_path: object) -> None:
    """A krexd that exits for a restart leaves MPS serving its running clients: the next
    one adopts that daemon instead of failing to start a second (`-d` on a used pipe)."""
    first = MpsManager(FAKE, str(tmp_path)).start(0)
    starts = os.path.join(first.log_dir, "starts")
    again = MpsManager(FAKE, str(tmp_path))  # the restarted krexd's
    try:
        d = again.start(0)
        assert d.pipe_dir == first.pipe_dir
        assert open(starts).read().count("started") == 1, "a second daemon was started"
        assert _daemons(d.pipe_dir)
    finally:
        again.stop(first)


def test_a_stale_control_pipe_is_replaced(tmp_path: object) -> None:
    """A pipe nobody reads (its daemon died with the host's krexd) does not block the start."""
    pipe_dir = os.path.join(str(tmp_path), "mps-gpu0", "pipe")
    os.makedirs(pipe_dir)
    os.mkfifo(os.path.join(pipe_dir, "control"))
    mgr = MpsManager(FAKE, str(tmp_path))
    fresh = MpsManager(FAKE, os.path.join(str(tmp_path), "fresh"))
    d, ref = mgr.start(0), fresh.start(0)
    try:
        assert _daemons(d.pipe_dir), "no control daemon after a stale pipe"
        # The client that asked the stale pipe is gone with its children, not left
        # blocked opening it (holding the pipe folder until krexd stops).
        assert len(_daemons(d.pipe_dir)) == len(_daemons(ref.pipe_dir))
    finally:
        mgr.stop(d)
        fresh.stop(ref)


def test_missing_control_program_is_a_clear_error(tmp_path: object) -> None:
    mgr = MpsManager("no-such-mps-control", str(tmp_path))
    with pytest.raises(MpsError, match="not found"):
        mgr.start(0)
    assert not os.path.exists(os.path.join(str(tmp_path), "mps-gpu0"))


@pytest.mark.root
def test_krexd_runs_mps_per_gpu_and_tenants_get_its_pipe(krexd_factory: object) -> None:
    import subprocess
    import sys

    k = krexd_factory(  # type: ignore[operator]
        fake_gpus=2, extra=f'[mps]\nenabled = true\ncontrol = "{FAKE}"\n'
    )
    pipes = [os.path.join(k.workdir, f"mps-gpu{g}", "pipe") for g in (0, 1)]
    assert all(os.path.exists(os.path.join(p, "control")) for p in pipes)
    out = subprocess.run(
        [
            *k.krex,
            "run",
            "--gpu",
            "1",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])",
        ],
        env=k.env,
        capture_output=True,
        timeout=60,
    )
    assert out.stdout.decode().strip() == pipes[1]
    k.stop()
    for p in pipes:
        assert not os.path.exists(os.path.join(p, "control")), "MPS left running after krexd"
