"""``krex run``: admit a command through krexd, start it inside its tenant cgroup, relay its end.

CMD runs as the user who ran ``krex run`` (krexd executes nothing); its
first instruction already runs in its tenant's cgroup.  The sequence:
:func:`run`; a command's life: docs/design/architecture.md; the options
and exit codes: README.md "Using it" and ``krex run --help``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from krex_cli import casualty, coldstart, compile_cache, grantlog, queued, slotmem, unreachable
from krex_cli.reconnect import Reconnecting
from krex_cli.warm import launch, plan
from krex_cli.warm.client import UNKNOWN_STATUS
from krex_client import cold_reasons
from krex_client.connection import KrexUnavailable, RemoteError
from krex_client.errors import COTENANT_TEXT, ExitCode

STRIPPED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _say(msg: str) -> None:
    print(f"krex: {msg}", file=sys.stderr, flush=True)


def tenant_environ(base: dict[str, str], granted: dict[str, str]) -> dict[str, str]:
    """CMD's environment: ``base`` minus systemd's notify variables (and any MPS pipe
    krexd did not grant), plus krexd's ``granted``.

    ``LD_PRELOAD`` from krexd is prepended to any value ``base`` already has.
    """
    env = {k: v for k, v in base.items() if k not in STRIPPED_ENV}
    if "CUDA_MPS_PIPE_DIRECTORY" not in granted:
        # MPS is krexd's to give: an inherited pipe would join another server, or make a
        # fault suspect's re-run without MPS (krex_cli.casualty) join this one.
        env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
        env.pop("CUDA_MPS_LOG_DIRECTORY", None)
    for key, value in granted.items():
        if key == "LD_PRELOAD" and env.get("LD_PRELOAD"):
            env[key] = f"{value}:{env['LD_PRELOAD']}"
        else:
            env[key] = value
    return env


def run(
    argv: list[str],
    socket: str,
    gpu: int | None = None,
    timeout_s: float | None = None,
    exclusive: bool = False,
    mem_bytes: int | None = None,
    label: str | None = None,
    retry_tempfail: int | None = None,
    fault_retries: int = casualty.DEFAULT_RETRIES,
    warm: bool | None = None,
    grant_log: str | None = None,
) -> int:
    """Run ``argv`` as a krex tenant through krexd at ``socket``; returns the exit code.

    ``mem_bytes``: the command's GPU memory need (bytes), None for krexd's default.
    ``label``: its name for learned needs (None: krexd derives it from ``argv``).
    ``retry_tempfail``: times to run it again after an exit 75 (None: krexd's default).
    ``fault_retries``: re-runs after GPU-wide faults it did not cause (``krex_cli.casualty``).
    ``warm``: start it from a warm pool when one can (``krex_cli.warm``), else cold;
    None: as krexd's ``[warm] start`` says (warm as shipped).
    ``grant_log``: a file to append each admission to (``krex_cli.grantlog``), or None.

    The layers, outermost first: fault re-runs (``casualty.with_reruns``, which
    may turn later runs exclusive), exit-75 retries (:func:`_retry_tempfail`),
    one run (:func:`_run`); all over one reconnecting connection.

    The sequence of one run:

    1. ``ping`` krexd (unreachable: one line naming the socket, exit 69; a
       stale socket file, with nothing listening, counts as unreachable at
       once; a socket this user may not open: "permission denied" with the
       group to join, exit 77).
    2. ``admit`` (parked server-side until a slot frees; no polling); while it
       waits, one line on stderr says its place in krexd's queue
       (``krex_cli.queued``).
    3. Create the tenant's slot memory when the reply asks for it
       (``krex_cli.slotmem``), then fork (``krex_cli.coldstart``): the child
       takes its own process group and blocks on a pipe; with ``--warm`` a warm
       pool's process is used instead when one can serve CMD
       (``krex_cli.warm.launch``).
    4. ``place`` the child (and name the slot memory); only then the child
       ``exec``s CMD.  On a lost krexd every request is re-sent to the krexd
       that comes back (``krex_cli.reconnect``).
    5. Wait for CMD; SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded to its process
       group, which becomes the terminal's foreground group when stdin is a
       terminal and ``krex run`` is in the foreground (Ctrl-C reaches CMD once).
    6. ``--timeout S``: SIGKILL to CMD's group (krexd kills what is left at
       ``release``); exit 124 with one line.
    7. ``release``; exit with CMD's code (128+N for signal N), except 75 when
       CMD failed and its memory record (the ``memory`` op, asked before
       ``release``) says co-tenants caused its out-of-memory errors, and
       krexd's own code (79) after its reason when krexd ended CMD.  An exit-75
       retry's ``admit`` is charged the memory the failed run used.

    Unless set, ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and
    ``CUDA_CACHE_PATH`` name the user's compile caches
    (``krex_cli.compile_cache``), trimmed after the command ends.
    """
    conn = Reconnecting(socket, timeout_s=5.0, on_reconnect=_resent)
    try:
        # No socket: one line, exit 69; krexd restarting: wait for it.
        about = conn.first_ping()
        retries = retry_tempfail
        if retries is None:
            retries = int(about.get("retry_tempfail") or 0)
        pools = _pools(about, warm)
        cache = compile_cache.prepare(about, os.environ, _say)

        one_run = functools.partial(_run, conn, argv, gpu, timeout_s, exclusive, mem_bytes)

        def attempt(without_mps: bool) -> int:
            return _retry_tempfail(
                argv, lambda: one_run(label, pools, grant_log, without_mps, cache.env), retries
            )

        code = casualty.with_reruns(argv, attempt, fault_retries)
        cache.trim()  # after the release: the slot is free; bounded, at most once a minute
        return code
    except unreachable.KREXD_ERRORS as exc:
        return unreachable.exit_code(exc, _say)
    finally:
        conn.close()


def _pools(about: dict[str, Any], warm: bool | None) -> plan.Settings:
    """krexd's ``[warm]`` settings from its ``ping`` reply ``about``; ``serve`` says whether
    the command starts warm (``warm``: ``--warm``/``--cold``, None: as ``[warm] start``
    says)."""
    settings = plan.Settings.from_ping(about)
    if warm is None:
        warm = settings.start == "warm"
        if not warm:  # -v says how every start krexd decided went (a --cold one is asked)
            launch.debug(f'cold start: krexd\'s [warm] start is "{settings.start}"')
    return dataclasses.replace(settings, serve=warm)


def _retry_tempfail(argv: list[str], attempt: Callable[[], int], retries: int) -> int:
    """Run ``attempt()`` and run it again, up to ``retries`` times, while it exits 75.

    Each retry is announced on stderr; krexd charges the new ``admit`` the
    memory the failed run used, so it starts once that much is free.
    """
    tries = 0
    while True:
        code = attempt()
        if code != ExitCode.TEMPFAIL or tries >= retries:
            return code
        tries += 1
        _say(
            f"running {argv[0]} again (retry {tries} of {retries} after exit "
            f"{int(ExitCode.TEMPFAIL)}): it starts once krexd finds the GPU memory its "
            "last run used free"
        )


def _run(
    conn: Reconnecting,
    argv: list[str],
    gpu: int | None,
    timeout_s: float | None,
    exclusive: bool,
    mem_bytes: int | None = None,
    label: str | None = None,
    warm: plan.Settings | None = None,
    grant_log: str | None = None,
    without_mps: bool = False,
    cache_env: dict[str, str] | None = None,
) -> int:
    body: dict[str, Any] = {"argv": argv, "exclusive": exclusive, "launcher_pid": os.getpid()}
    if without_mps and not exclusive:
        body["mps"] = False  # a fault suspect's re-run (krex_cli.casualty)
    if gpu is not None:
        body["gpu"] = gpu
    if mem_bytes is not None:
        body["mem_bytes"] = mem_bytes
    if label is not None:
        body["label"] = label
    asked = time.monotonic()
    notice, close_notice = queued.for_run(conn.socket, gpu, launch.debug_enabled())
    try:
        granted = conn.request("admit", body, forever=True, while_waiting=notice.poll)
    except KeyboardInterrupt:
        notice.done()
        _say("interrupted while waiting for a slot")
        return 128 + signal.SIGINT
    finally:
        notice.done()
        close_notice()
    # How long the command waited for its slot (ms), for its own record.
    admit_ms = (time.monotonic() - asked) * 1e3
    granted.setdefault("env", {})["KREX_ADMIT_MS"] = f"{admit_ms:.3f}"
    if grant_log is not None:
        grantlog.append(grant_log, granted, admit_ms)
    tenant = Reconnecting(conn.socket, int(granted["tenant"]), str(granted["token"]), 10.0, _resent)
    try:
        return _launch(tenant, argv, granted, timeout_s, warm, cache_env or {})
    finally:
        tenant.close()


def _resent(op: str) -> None:
    # krexd restarted under the command (it keeps running, adopted by the new krexd).
    if op == "ping":
        _say("krexd is not answering (restarting?); waiting for it")
    else:
        _say(f"krexd restarted; sent '{op}' again")


def _launch(
    tenant: Reconnecting,
    argv: list[str],
    granted: dict[str, Any],
    timeout_s: float | None,
    warm: plan.Settings | None = None,
    cache_env: dict[str, str] | None = None,
) -> int:
    """Start CMD (warm when ``warm`` is given and a pool can, else cold), wait, release.

    ``cache_env``: the compile caches' variables (``krex_cli.compile_cache``), added
    before a pool's key is made, so a warm pool imports under them too.
    """
    base = {**(cache_env or {}), **os.environ}
    env = tenant_environ(base, {str(k): str(v) for k, v in granted["env"].items()})
    path, err, why = coldstart.resolve(argv[0], env)
    if path is None:
        _say(f"{argv[0]}: {why}")
        _release(tenant, {"exit_code": err})
        return err
    place: dict[str, Any] = {}
    slots = granted.get("slots")
    if slots:
        try:
            slots_fd = slotmem.create(int(slots["size"]), bytes(slots["header"]))
        except OSError as exc:
            _say(f"cannot create the tenant's slot memory: {exc.strerror}")
            _release(tenant, {"exit_code": ExitCode.SOFTWARE})
            return ExitCode.SOFTWARE
        env.update(slotmem.environ(slots_fd))
        place["slots_fd"] = slots_fd
    try:
        if warm is not None and warm.serve:
            ended = launch.attempt(tenant, argv, path, env, granted, place, timeout_s, warm)
            if ended is not None:
                return _ended(tenant, argv, ended.status, ended.timed_out, timeout_s)
        elif warm is not None:
            launch.cold(place, warm, cold_reasons.ASKED, None)
        status = coldstart.run_cold(tenant, path, argv, env, place, timeout_s)
    except (KrexUnavailable, RemoteError):
        _release(tenant, {"signal": int(signal.SIGKILL)})  # placing failed: nothing runs
        raise
    return _ended(tenant, argv, status or 0, status is None, timeout_s)


def _ended(
    tenant: Reconnecting, argv: list[str], status: int, timed_out: bool, timeout_s: float | None
) -> int:
    """Release the tenant with how CMD ended (wait ``status``); ``krex run``'s exit code."""
    if timed_out:
        _release(tenant, {"signal": int(signal.SIGKILL)})
        _say(f"timeout: {argv[0]} ran longer than {timeout_s:g} s; killed its process tree")
        return ExitCode.TIMEOUT
    if status == UNKNOWN_STATUS:
        _say(
            f"the warm pool that started {argv[0]} died while it ran: its exit status is "
            f"unknown (exit {int(ExitCode.SOFTWARE)})"
        )
        _release(tenant, {"exit_code": ExitCode.SOFTWARE})
        return ExitCode.SOFTWARE
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        memory = _memory_record(tenant, 128 + signum)
        return _outcome(argv, 128 + signum, memory, _release(tenant, {"signal": signum}))
    code = os.waitstatus_to_exitcode(status)
    memory = _memory_record(tenant, code)
    return _outcome(argv, code, memory, _release(tenant, {"exit_code": code}))


def _memory_record(tenant: Reconnecting, code: int) -> dict[str, Any]:
    """The command's memory record when it failed (``{}`` when it succeeded or krexd cannot say)."""
    if code == 0:
        return {}
    try:
        return dict(tenant.request("memory"))
    except (KrexUnavailable, RemoteError):
        return {}


def _outcome(
    argv: list[str], code: int, memory: dict[str, Any], reply: dict[str, Any] | None
) -> int:
    """CMD's exit ``code``, or 75 when it failed after co-tenants' out-of-memory errors.

    krexd's own code for a kill of its own (79: unprotectable) comes first.
    Raises ``casualty.Casualty`` when it failed with a GPU-wide fault under MPS
    that may not be its own (``krex_cli.casualty``: it is run again).
    """
    killed_with = (reply or {}).get("exit_code")
    if code != 0 and killed_with is not None:
        return int(killed_with)  # krexd ended CMD for a reason of its own (said already)
    casualty.judge(argv, code, reply)
    failed_for_cotenants = int(memory.get("oom_cotenant") or 0)
    if code == 0 or not failed_for_cotenants or (reply or {}).get("kill_reason"):
        return code
    why = COTENANT_TEXT.get(str(memory.get("last_cotenant_oom")), "co-tenants held the memory")
    _say(
        f"{argv[0]} failed (exit {code}) after {failed_for_cotenants} GPU out-of-memory "
        f"error(s) caused by co-tenants ({why}); exit {int(ExitCode.TEMPFAIL)} "
        "(EX_TEMPFAIL): run it again"
    )
    return ExitCode.TEMPFAIL


def _release(tenant: Reconnecting, body: dict[str, int]) -> dict[str, Any] | None:
    """Tell krexd the command ended; its reply (None when krexd did not answer)."""
    try:
        reply = tenant.request("release", body)
    except (KrexUnavailable, RemoteError) as exc:
        _say(f"warning: krexd did not confirm the end of the command: {exc}")
        return None
    if reply.get("kill_reason"):
        _say(f"krexd killed the command: {reply['kill_reason']}")
    return reply
