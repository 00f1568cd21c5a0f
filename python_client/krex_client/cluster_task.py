"""The Ray task of :mod:`krex_client.cluster`: one ``krex run`` against this host's krexd.

:func:`execute` runs ``krex run [options] --grant-log G --region-log R
--die-with <worker> -- ARGV`` with the worker's environment plus the
command's and returns a ``cluster.Result``.  However the task ends
(``ray.cancel``, the worker's death), the command and its tenant end too:
docs/install.md "What failures do", docs/design/interfaces.md "Several
hosts (Ray)".  Ray is not imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any

from krex_client.cluster import OUTPUT_TAIL, Command, Result, Timings, host_name

MAX_REGIONS = 100_000
"""Region records a result carries at most (the first ones)."""
MAX_GRANTS = 1000
"""Grant lines a result counts at most."""
GRANTS_BYTES = 1 << 20
"""Bytes of the grant log read at most (a line is about 100)."""
REGIONS_BYTES = 64 << 20
"""Bytes of the region log read at most (a record is a few hundred)."""
POLL_S = 0.1
"""How often the wait for ``krex run`` lets an interruption (``ray.cancel``) through."""


def krex_argv(krex: Sequence[str] | None = None) -> list[str]:
    """How to call ``krex`` here: ``krex``, else ``$KREX_CLI``, else ``krex`` on PATH, else
    ``python -m krex_cli``."""
    if krex:
        return list(krex)
    if os.environ.get("KREX_CLI"):
        return shlex.split(os.environ["KREX_CLI"])
    found = shutil.which("krex")
    return [found] if found else [sys.executable, "-m", "krex_cli"]


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to ``krex run`` (it forwards it to the command), SIGKILL after ``grace_s``."""
    try:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()  # krexd sees its launcher gone and kills the tenant's cgroup
            proc.wait()


class _KrexRun(subprocess.Popen[bytes]):
    """``subprocess.Popen`` that puts itself in ``holder`` before it starts the child.

    ``ray.cancel``'s KeyboardInterrupt (or SIGTERM's SystemExit) can arrive
    while the constructor waits for the child's exec, after the fork: the
    constructor raises and returns no object, but ``holder`` keeps the one
    that knows the child's pid, so it can be stopped and reaped as any other
    (:func:`_stop`; its ``returncode`` recorded, so no stale object reaps a
    reused pid later).
    """

    def __init__(self, holder: list[subprocess.Popen[bytes]], *args: Any, **kwargs: Any) -> None:
        holder.append(self)
        super().__init__(*args, **kwargs)


def _stop_unseen(work: str, grace_s: float) -> None:
    """Stop a ``krex run`` forked by an interrupted ``Popen`` that had not stored its pid.

    Found among this process's children by its command line, which names the
    task's private directory ``work``; stopped as :func:`_stop` would
    (SIGTERM, SIGKILL after ``grace_s``) and reaped.
    """
    pids = _children_naming(work)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids:
        for pid in list(pids):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # reaped elsewhere (subprocess's own cleanup)
            if done:
                pids.remove(pid)
        if pids and time.monotonic() >= deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        elif pids:
            time.sleep(POLL_S / 10)


def _children_naming(work: str) -> list[int]:
    """Pids of this process's children whose command line contains ``work``."""
    me, needle, found = os.getpid(), work.encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
    return found


def _wait(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """Wait for ``krex run``; on any interruption stop it (:func:`_stop`) and re-raise."""
    try:
        while True:
            # Short waits: ray.cancel's KeyboardInterrupt arrives between them.
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(POLL_S)
    except BaseException:
        _stop(proc, grace_s)
        raise


def _tail(f: IO[bytes]) -> tuple[str, int]:
    """(the last :data:`OUTPUT_TAIL` bytes of ``f``, decoded; its size in bytes)."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - OUTPUT_TAIL))
    return f.read(OUTPUT_TAIL).decode(errors="replace"), size


def _json_lines(path: str, limit: int, max_bytes: int) -> list[dict[str, Any]]:
    """The JSON objects of the file ``path``, one per line, at most ``limit`` ([] if none).

    The file lies in the task's private directory, but the command (same uid,
    untrusted code) can read its path from ``krex run``'s command line and
    replace it.  So only a regular file is read (not a symbolic link: a FIFO
    would block the task, ``/dev/zero`` would fill the worker's memory
    outside the tenant's cgroup), and at most ``max_bytes`` of it; a cut last
    line is skipped as any malformed one.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = f.read(max_bytes)
    out: list[dict[str, Any]] = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        if len(out) >= limit:
            break
        with contextlib.suppress(json.JSONDecodeError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                out.append(obj)
    return out


def _where() -> tuple[str | None, int]:
    """(this Ray node's id, this task's attempt: 1 for the first run); (None, 1) outside Ray.

    A Ray worker has imported ``ray`` already; nothing is imported here.
    """
    ray: Any = sys.modules.get("ray")
    node: str | None = None
    attempt = 1
    # Not connected: asking would start a local Ray (its auto-init).
    if ray is None or not ray.is_initialized():
        return node, attempt
    with contextlib.suppress(Exception):  # not in a Ray worker
        node = str(ray.get_runtime_context().get_node_id())
    with contextlib.suppress(Exception):  # no public API for the attempt number (Ray 2.60)
        core = ray._private.worker.global_worker.core_worker
        attempt = int(core.get_current_task_attempt_number()) + 1
    return node, attempt


GRANTS = "grants.jsonl"
REGIONS = "regions.jsonl"


def _argv(command: Command, work: str, krex: Sequence[str] | None) -> list[str]:
    """``krex run`` for ``command``, its logs in the directory ``work``."""
    # --die-with: krex run arms its parent-death signal itself (no preexec_fn in
    # this multithreaded worker, and the spawn may use vfork).
    logs = ["--grant-log", os.path.join(work, GRANTS), "--die-with", str(os.getpid())]
    if command.region_log:
        logs += ["--region-log", os.path.join(work, REGIONS)]
    return [*krex_argv(krex), "run", *command.krex_run_options(), *logs, "--", *command.argv]


def _run(
    argv: list[str], command: Command, work: str, grace_s: float
) -> tuple[int, float, tuple[str, int], tuple[str, int]]:
    """Run ``argv``; (exit code, end time, (stdout tail, size), (stderr tail, size))."""
    with tempfile.TemporaryFile(dir=work) as out, tempfile.TemporaryFile(dir=work) as err:
        holder: list[subprocess.Popen[bytes]] = []
        try:
            proc = _KrexRun(
                holder,
                argv,
                cwd=command.cwd,
                env={**os.environ, **command.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except BaseException:
            # Interrupted inside the constructor: krex run may run, unseen by the caller.
            started = holder[0] if holder else None
            if started is not None and getattr(started, "pid", None):
                _stop(started, grace_s)
            else:
                _stop_unseen(work, grace_s)
            raise
        code = _wait(proc, grace_s)
        ended = time.time()
        return (code if code >= 0 else 128 - code), ended, _tail(out), _tail(err)


def execute(
    command: Command,
    submitted: float,
    cancel_grace_s: float = 5.0,
    krex: Sequence[str] | None = None,
) -> Result:
    """Run ``command`` through ``krex run`` on this host; its :class:`Result`.

    ``submitted``: the driver's submission time (unix s).  ``cancel_grace_s``:
    seconds between SIGTERM and SIGKILL to ``krex run`` when the task is
    interrupted.  ``krex``: how to call ``krex`` (:func:`krex_argv`).
    Raises whatever interrupted the task, after ``krex run`` is gone.
    """
    started = time.time()
    node, attempt = _where()
    with tempfile.TemporaryDirectory(prefix="krex-task-") as work:
        code, ended, out, err = _run(_argv(command, work, krex), command, work, cancel_grace_s)
        grants = _json_lines(os.path.join(work, GRANTS), MAX_GRANTS, GRANTS_BYTES)
        regions = _json_lines(os.path.join(work, REGIONS), MAX_REGIONS, REGIONS_BYTES)
    last = grants[-1] if grants else {}
    return Result(
        exit_code=code,
        stdout=out[0],
        stderr=err[0],
        stdout_bytes=out[1],
        stderr_bytes=err[1],
        regions=regions,
        host=host_name(),
        node_id=node,
        gpu=last.get("gpu"),
        gpu_uuid=last.get("gpu_uuid"),
        tenant=last.get("tenant"),
        attempt=attempt,
        admissions=len(grants),
        timings=Timings(
            submitted=submitted,
            started=started,
            admitted=last.get("time"),
            ended=ended,
            admit_wait_s=sum(float(g.get("admit_ms") or 0.0) for g in grants) / 1000.0,
        ),
    )
