"""krex_client.cluster without a Ray cluster: commands, and the task's ``krex run`` handling.

The task (:func:`krex_client.cluster_task.execute`) runs here against a
stand-in ``krex`` (progs/fake_krex.py), outside Ray: what it passes to
``krex run``, what it reads back (grant, region records, output tails), and
that ``krex run`` does not outlive an interrupted or killed task.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_client import cluster
from krex_client.cluster_task import execute

FAKE_KREX = [sys.executable, str(Path(__file__).resolve().parent / "progs" / "fake_krex.py")]


def test_command_checks_and_krex_run_options() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        cluster.Command([])
    with pytest.raises(ValueError, match="KREX_SOCKET"):
        cluster.Command(["true"], env={"KREX_SOCKET": "/elsewhere"})
    with pytest.raises(ValueError, match="timeout_s"):
        cluster.Command(["true"], timeout_s=0)
    c = cluster.Command(["b"], mem="8G", label="l", timeout_s=30, gpu=1)
    assert c.krex_run_options() == ["--gpu", "1", "--mem", "8G", "--label", "l"] + [
        "--timeout",
        "30.0",
    ]
    assert cluster.Command(["b"]).krex_run_options() == []
    with pytest.raises(ValueError, match="start"):
        cluster.Command(["b"], start="hot")
    assert cluster.Command(["b"], start="warm").krex_run_options() == ["--warm"]
    assert cluster.Command(["b"], gpu=0, start="cold").krex_run_options()[-1] == "--cold"


def test_host_names_make_valid_resource_names(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cluster.host_resource("gpu-7.lab") == "krex_host_gpu-7.lab"
    assert cluster.host_name("a b/c") == "a_b_c"
    monkeypatch.setenv("KREX_HOST", "node3")
    assert cluster.host_name() == "node3"


def test_task_options_ask_for_one_slot_and_no_cpu() -> None:
    opts = cluster.task_options(cluster.Command(["x"], host="a"), max_retries=3)
    assert opts["num_cpus"] == 0 and opts["max_retries"] == 3
    assert opts["resources"] == {"krex_slot": 1.0, "krex_host_a": 1.0}
    assert opts["retry_exceptions"] is False


def test_execute_runs_krex_run_and_reads_back_what_it_recorded(tmp_path: Path) -> None:
    script = "import sys; print('o' * 70000 + 'LAST'); print('err', file=sys.stderr); sys.exit(3)"
    cmd = cluster.Command(
        [sys.executable, "-c", script], cwd=str(tmp_path), env={"X": "1"}, mem="1G"
    )
    submitted = time.time()
    res = execute(cmd, submitted, 1.0, FAKE_KREX)
    assert res.exit_code == 3 and not res.ok
    assert res.stdout.endswith("LAST\n") and len(res.stdout) == cluster.OUTPUT_TAIL
    assert res.stdout_bytes == 70005 and res.stderr == "err\n"
    assert (res.gpu, res.gpu_uuid, res.tenant, res.admissions) == (1, "GPU-x", 7, 1)
    assert res.attempt == 1 and res.node_id is None  # outside Ray
    # One region record (the garbled line is skipped); krex run got the command's options.
    (region,) = res.regions
    assert region["region_ms"] == 1.5 and region["opts"][:2] == ["--mem", "1G"]
    t = res.timings
    assert submitted <= t.started <= t.ended and t.admit_wait_s == pytest.approx(0.0125)
    assert t.admitted is not None and t.ran_s is not None and t.ran_s >= 0


def test_execute_passes_the_start_preference_to_krex_run() -> None:
    for start, flags in ((None, []), ("cold", ["--cold"]), ("warm", ["--warm"])):
        res = execute(cluster.Command(["true"], start=start), time.time(), 1.0, FAKE_KREX)
        (region,) = res.regions
        assert [o for o in region["opts"] if o in ("--warm", "--cold")] == flags, start


def test_execute_without_region_log(tmp_path: Path) -> None:
    res = execute(cluster.Command(["true"], region_log=False), time.time(), 1.0, FAKE_KREX)
    assert res.ok and res.regions == []


RUNNER = """
import signal, sys, time
from krex_client.cluster import Command
from krex_client.cluster_task import execute
# As in a Ray worker: SIGTERM raises SystemExit, and the worker outlives its task.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
try:
    execute(Command(["sleep", "60"]), time.time(), float(sys.argv[1]), sys.argv[2:])
except BaseException as exc:
    print(type(exc).__name__, flush=True)
    time.sleep(30)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or before the read
        return False


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids the test started; whatever of them still runs is killed afterwards."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_task(
    tmp_path: Path, started: list[int], deaf: bool, grace_s: float
) -> tuple[subprocess.Popen[str], int]:
    """A process running execute() on ``sleep 60``; (it, the stand-in krex run's pid)."""
    pidfile = tmp_path / "krex.pid"
    env = dict(os.environ, FAKE_KREX_PIDFILE=str(pidfile), FAKE_KREX_DEAF="1" if deaf else "0")
    env["TMPDIR"] = str(tmp_path)  # a killed task leaves its work directory behind
    task = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(grace_s), *FAKE_KREX],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
    )
    started.append(task.pid)
    deadline = time.monotonic() + 20
    while not (pidfile.is_file() and pidfile.read_text()):
        assert time.monotonic() < deadline and task.poll() is None, "the task did not start"
        time.sleep(0.02)
    started.append(int(pidfile.read_text()))
    return task, started[-1]


def wait_gone(pid: int, timeout_s: float) -> float:
    """Seconds until ``pid`` is gone (fails after ``timeout_s``)."""
    t0 = time.monotonic()
    while alive(pid):
        assert time.monotonic() - t0 < timeout_s, f"{pid} still runs"
        time.sleep(0.02)
    return time.monotonic() - t0


def interrupted(task: subprocess.Popen[str]) -> str:
    """What the task raised (the runner prints it and lives on, as a Ray worker does)."""
    assert task.stdout is not None
    try:
        return task.stdout.readline().strip()
    finally:
        task.kill()
        task.wait()


@pytest.mark.parametrize(
    "sig, raised", [(signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, "SystemExit")]
)
def test_an_interrupted_task_stops_krex_run(
    tmp_path: Path, started: list[int], sig: int, raised: str
) -> None:
    task, krex = start_task(tmp_path, started, deaf=False, grace_s=10.0)
    task.send_signal(sig)  # ray.cancel raises KeyboardInterrupt, as SIGINT does
    assert wait_gone(krex, 5.0) < 5.0  # SIGTERM ended it, long before the grace
    assert interrupted(task) == raised  # and only then the task raised


# ray.cancel's KeyboardInterrupt inside Popen, after its fork, while it waits for the exec:
# no Popen object names the child. Made deterministic by raising it there.
RUNNER_INTERRUPTED_IN_POPEN = """
import subprocess, sys, time
from krex_client.cluster import Command
from krex_client.cluster_task import execute
real = subprocess.Popen._close_pipe_fds  # runs after the fork, before the wait for the exec
def interrupted(self, *args):
    real(self, *args)
    print(self.pid, flush=True)
    time.sleep(0.5)  # krex run writes its pid file meanwhile
    raise KeyboardInterrupt
subprocess.Popen._close_pipe_fds = interrupted
try:
    execute(Command(["sleep", "60"]), time.time(), float(sys.argv[1]), sys.argv[2:])
except BaseException as exc:
    print(type(exc).__name__, flush=True)
    time.sleep(30)
"""


def test_a_task_interrupted_inside_popen_stops_the_krex_run_it_started(
    tmp_path: Path, started: list[int]
) -> None:
    pidfile = tmp_path / "krex.pid"
    env = dict(os.environ, FAKE_KREX_PIDFILE=str(pidfile), FAKE_KREX_DEAF="0")
    task = subprocess.Popen(
        [sys.executable, "-c", RUNNER_INTERRUPTED_IN_POPEN, "10", *FAKE_KREX],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
    )
    started.append(task.pid)
    assert task.stdout is not None
    krex = int(task.stdout.readline())  # the child Popen started, as it was interrupted
    started.append(krex)
    assert task.stdout.readline().strip() == "KeyboardInterrupt"
    assert not alive(krex)  # stopped (and reaped) before the interrupt went on


def test_krex_run_deaf_to_sigterm_is_killed_after_the_grace(
    tmp_path: Path, started: list[int]
) -> None:
    task, krex = start_task(tmp_path, started, deaf=True, grace_s=1.0)
    task.send_signal(signal.SIGINT)
    took = wait_gone(krex, 10.0)
    assert 0.8 < took < 5.0, took
    assert interrupted(task) == "KeyboardInterrupt"


def test_krex_run_dies_with_a_killed_task(tmp_path: Path, started: list[int]) -> None:
    task, krex = start_task(tmp_path, started, deaf=True, grace_s=60.0)
    task.kill()  # as ray.cancel(force=True), or the raylet's end, kills a worker
    task.wait(10)
    wait_gone(krex, 5.0)


# The command (untrusted code, the task's uid) finds the task's log files on krex run's command
# line and replaces them: the grant log by a FIFO, the region log by a link to /dev/zero.
_SWAP_LOGS = """
import os
args = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
grants, regions = (args[args.index(o) + 1] for o in ("--grant-log", "--region-log"))
os.unlink(grants)
os.mkfifo(grants)
os.unlink(regions)
os.symlink("/dev/zero", regions)
"""
_EXECUTE_BOUNDED = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from krex_client import cluster
from krex_client.cluster_task import execute
res = execute(cluster.Command([sys.executable, "-c", sys.argv[1]]), time.time(), 1.0, sys.argv[2:])
print(json.dumps({"code": res.exit_code, "admissions": res.admissions, "regions": res.regions}))
"""


def test_a_command_that_swaps_its_task_logs_cannot_block_or_flood_the_task() -> None:
    """A FIFO would block the worker's read for ever, /dev/zero fill its memory (outside the
    tenant's cgroup): only regular files are read, and only so much of them."""
    p = subprocess.run(
        [sys.executable, "-c", _EXECUTE_BOUNDED, _SWAP_LOGS, *FAKE_KREX],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == '{"code": 0, "admissions": 0, "regions": []}'


_APPEND = """
import sys
from krex_cli import grantlog
grantlog.append(sys.argv[1], {"tenant": 1, "gpu": 0, "env": {}}, 1.0)
"""


def test_the_grant_log_is_written_only_to_a_regular_file(tmp_path: Path) -> None:
    """``krex run --grant-log``: a FIFO at the path (no reader) would block krex run in open."""

    def append(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _APPEND, str(path)], capture_output=True, text=True, timeout=10
        )

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    p = append(fifo)
    assert p.returncode == 0 and "cannot write the grant log" in p.stderr
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: the open succeeds
    try:
        p = append(fifo)
        assert "not a regular file" in p.stderr
        assert os.read(reader, 100) == b""  # nothing went into it
    finally:
        os.close(reader)
    link = tmp_path / "link"
    link.symlink_to("/dev/null")
    assert "symbolic link: not followed" in append(link).stderr
    good = tmp_path / "grants"
    assert append(good).stderr == ""
    assert '"tenant":1' in good.read_text()
