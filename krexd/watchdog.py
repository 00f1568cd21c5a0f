"""Bounded freeze without krexd: krexd's heartbeat and the watchdog process that reads it.

Guarantee (docs/design/daemon.md "Restarts"): no tenant stays frozen, and no
gate stays closed, longer than ``[daemon] freeze_bound_s`` after krexd's
last heartbeat, whether krexd was SIGKILLed, crashed, or hangs, and whether
or not a successor ever starts.

* krexd writes ``<state_dir>/<cgroup name>.heartbeat`` once a second from its
  event loop (a hung loop stops beating): ``"<pid> <start> <boottime ns>"``,
  its pid, its start time (clock ticks since boot; with the pid it names the
  process) and ``CLOCK_BOOTTIME`` (never jumps, counts suspend).
* at start krexd launches ``python -m krexd.watchdog`` in its own session
  (``start_new_session``), so the watchdog outlives krexd's death and, under
  systemd with ``KillMode=process``, the service's restart.  The watchdog
  polls every 0.5 s.  When the heartbeat is older than ``freeze_bound_s - 1``
  it thaws every directory of the cgroup tree (top-down) and reopens every
  gate for the word it holds, then keeps watching.  It exits when the
  heartbeat file is removed (krexd stopped and cleaned up itself) or names
  another live krexd (a successor runs its own watchdog), or when its krexd is
  dead and the tree holds no tenant.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

from krexd import state as saved_state

_log = logging.getLogger("krexd.watchdog")

POLL_S = 0.5
BEAT_S = 1.0


def boottime_ns() -> int:
    """``CLOCK_BOOTTIME`` in ns (monotonic, includes suspend)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def heartbeat_path(state_dir: str, cgroup_name: str) -> str:
    """The heartbeat file of the cgroup tree ``cgroup_name``."""
    return os.path.join(state_dir, f"{cgroup_name}.heartbeat")


class Heartbeat:
    """krexd's side: ``beat()`` once a second from the event loop."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pid = os.getpid()
        self._start = saved_state.process_start(self._pid) or 0
        self.beat()

    def beat(self) -> None:
        """Write pid, start time and the boot-time clock (one small write, then rename)."""
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{self._pid} {self._start} {boottime_ns()}\n")
        os.replace(tmp, self.path)

    def remove(self) -> None:
        """Delete the heartbeat (full stop): the watchdog exits."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def read_heartbeat(path: str) -> tuple[int, int, int] | None:
    """``(pid, start, boottime_ns)`` from the heartbeat file; None when absent or garbled."""
    try:
        with open(path) as f:
            pid, start, ns = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return pid, start, ns


def spawn(heartbeat: str, tree: str, gates: list[str], bound_s: float) -> subprocess.Popen[bytes]:
    """Start the watchdog for krexd (this process) in its own session."""
    argv = [sys.executable, "-m", "krexd.watchdog", "--heartbeat", heartbeat, "--tree", tree]
    argv += ["--bound", f"{bound_s:g}", "--pid", str(os.getpid())]
    for g in gates:
        argv += ["--gate", g]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def thaw_tree(tree: str) -> int:
    """Write 0 to every ``cgroup.freeze`` under ``tree``, top-down; how many were written."""
    n = 0
    for directory, _dirs, files in os.walk(tree):  # os.walk is top-down
        if "cgroup.freeze" in files:
            try:
                with open(os.path.join(directory, "cgroup.freeze"), "w") as f:
                    f.write("0")
                n += 1
            except OSError:
                pass
    return n


def reopen_gates(gates: list[str]) -> None:
    """Reopen every gate for the (holder, epoch) word it holds."""
    if not gates:
        return
    from krexd.gate import Gate, GateError  # needs libkrex_gate.so: only when there are gates

    for path in gates:
        try:
            gate = Gate.open(path, None)
        except GateError as exc:
            _log.error("%s", exc)
            continue
        try:
            word = gate.word
            if word is not None:
                gate.reopen(*word)
                _log.warning("reopened gate %s (tenant %d, epoch %d)", path, *word)
        except GateError as exc:
            _log.error("%s", exc)
        finally:
            gate.unmap()


def unlock_ledgers(gates: list[str]) -> int:
    """Unlock the processes each GPU's lock ledger names (``krexd.lock_ledger``); how many.

    The ledger of gate ``<dir>/<name>-gpu<N>.gate`` is ``<dir>/<name>-gpu<N>.locks``.
    """
    from krexd.driverlock import DriverLock, DriverLockUnavailable
    from krexd.lock_ledger import LockLedger

    n = 0
    for path in gates:
        ledger = LockLedger(path[: -len(".gate")] + ".locks", -1)
        pids = ledger.live()
        if not pids:
            continue
        try:
            DriverLock().unlock_all(pids)
        except DriverLockUnavailable as exc:
            _log.error("cannot unlock %s: %s", pids, exc)
            continue
        ledger.clear()
        n += len(pids)
    return n


def _tenants_left(tree: str) -> bool:
    for _directory, dirs, _files in os.walk(tree):
        if any(d.startswith("t") and d[1:].isdigit() for d in dirs):
            return True
    return False


def watch(heartbeat: str, tree: str, gates: list[str], bound_s: float, pid: int) -> int:
    """The watchdog's loop (see the module docstring); returns the exit code."""
    limit_ns = int(max(0.5, bound_s - 1.0) * 1e9)
    thawed_for: int | None = None  # heartbeat time of the last thaw
    while True:
        hb = read_heartbeat(heartbeat)
        if hb is None:
            if not os.path.exists(heartbeat):
                return 0  # krexd stopped and removed it
            time.sleep(POLL_S)
            continue
        hb_pid, hb_start, hb_ns = hb
        owner_alive = saved_state.process_start(hb_pid) == hb_start
        if hb_pid != pid and owner_alive:
            return 0  # a successor krexd runs its own watchdog
        if boottime_ns() - hb_ns > limit_ns and thawed_for != hb_ns:
            thawed_for = hb_ns
            n = thaw_tree(tree)
            unlocked = unlock_ledgers(gates)
            reopen_gates(gates)
            _log.warning(
                "no heartbeat from krexd (pid %d) for %.1f s: thawed %d cgroup(s) under %s, "
                "unlocked %d process(es)",
                hb_pid,
                (boottime_ns() - hb_ns) / 1e9,
                n,
                tree,
                unlocked,
            )
        if thawed_for == hb_ns and not owner_alive and not _tenants_left(tree):
            return 0
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    """``python -m krexd.watchdog --heartbeat F --tree DIR --bound S --pid P [--gate G]...``."""
    p = argparse.ArgumentParser(prog="krexd-watchdog", description=__doc__.splitlines()[0])
    p.add_argument("--heartbeat", required=True)
    p.add_argument("--tree", required=True)
    p.add_argument("--bound", type=float, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--gate", action="append", default=[])
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="krexd-watchdog: %(message)s")
    return watch(args.heartbeat, args.tree, args.gate, args.bound, args.pid)


if __name__ == "__main__":
    sys.exit(main())
