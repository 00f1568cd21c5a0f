"""Bounded freeze without krexd: krexd's heartbeat and the watchdog process that reads it.

No tenant stays frozen, and no gate closed, longer than ``[daemon]
freeze_bound_s`` after krexd's last heartbeat: the watchdog, in a session
of its own, confirms krexd is gone, then thaws the tree, unlocks what the
driver locked and reopens every gate.  docs/design/daemon.md "Restarts",
"Bounded freeze without krexd".
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import subprocess
import sys
import time

from krexd.restarts import saved_state

_log = logging.getLogger("krexd.watchdog")

POLL_S = 0.5
BEAT_S = 1.0
PING_S = 0.5  # a krexd whose heartbeat is stale must answer ping this fast to be spared


def boottime_ns() -> int:
    """``CLOCK_BOOTTIME`` in ns (monotonic, includes suspend)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def heartbeat_path(state_dir: str, cgroup_name: str) -> str:
    """The heartbeat file of the cgroup tree ``cgroup_name``."""
    return os.path.join(state_dir, f"{cgroup_name}.heartbeat")


#: The heartbeat record: pid, start time, ``CLOCK_BOOTTIME`` ns, zero-padded to a fixed
#: length so that every beat overwrites the one before in place (no new disk blocks).
RECORD = "%010d %020d %020d\n"
RECORD_BYTES = len(RECORD % (0, 0, 0))


class Heartbeat:
    """krexd's side: ``beat()`` once a second from the event loop.

    The file is written in place: one ``pwrite`` of :data:`RECORD_BYTES`
    bytes at offset 0 of a file opened once, so a beat needs no new disk
    blocks once the first has been written (a full state directory does not
    stop it).  A beat that fails is logged once, and once more when beats
    work again.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._pid = os.getpid()
        self._start = saved_state.process_start(self._pid) or 0
        self._fd: int | None = None
        self.failing = False
        self.beat()

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o644)
        try:
            if os.fstat(fd).st_size > RECORD_BYTES:  # an older, longer format: cut (no blocks)
                os.ftruncate(fd, RECORD_BYTES)
        except OSError:
            os.close(fd)
            raise
        return fd

    def beat(self) -> bool:
        """Write pid, start time and the boot-time clock in place; False when it failed."""
        record = (RECORD % (self._pid, self._start, boottime_ns())).encode()
        try:
            if self._fd is None:
                self._fd = self._open()
            os.pwrite(self._fd, record, 0)
        except OSError as exc:
            if not self.failing:
                _log.error("heartbeat %s cannot be written: %s", self.path, exc)
            self.failing = True
            return False
        if self.failing:
            _log.warning("heartbeat %s written again", self.path)
        self.failing = False
        return True

    def remove(self) -> None:
        """Delete the heartbeat (full stop): the watchdog exits."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
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


def spawn(
    heartbeat: str, tree: str, gates: list[str], bound_s: float, socket: str | None = None
) -> subprocess.Popen[bytes]:
    """Start the watchdog for krexd (this process) in its own session.

    ``socket``: krexd's control socket, pinged to confirm that a krexd whose
    heartbeat is stale is really gone (None: the heartbeat alone decides).
    """
    argv = [
        sys.executable,
        "-m",
        "krexd.restarts.watchdog",
        "--heartbeat",
        heartbeat,
        "--tree",
        tree,
    ]
    argv += ["--bound", f"{bound_s:g}", "--pid", str(os.getpid())]
    if socket:
        argv += ["--socket", socket]
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
    """Unlock the processes each GPU's lock ledger names (``krexd.hardware.lock_ledger``); how many.

    The ledger of gate ``<dir>/<name>-gpu<N>.gate`` is ``<dir>/<name>-gpu<N>.locks``.
    """
    from krexd.hardware.driverlock import DriverLock, DriverLockUnavailable
    from krexd.hardware.lock_ledger import LockLedger

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


class Watched:
    """The krexd a watchdog watches: its pid, held as a pidfd, and its socket.

    Args:
        pid: krexd's pid (``--pid``).
        socket: its control socket, or None.
    """

    def __init__(self, pid: int, socket: str | None) -> None:
        self.pid = pid
        self.socket = socket
        self._pidfd: int | None = None
        self._start: int | None = None

    def alive(self, start: int) -> bool:
        """True while the process ``pid`` that started at ``start`` (clock ticks) runs.

        Polls a pidfd opened at the first call (its start time checked after
        the open, so the pidfd names that process): exact, and immune to a
        reused pid.
        """
        if self._pidfd is None or self._start != start:
            self.close()
            try:
                fd = os.pidfd_open(self.pid)
            except OSError:
                return False
            if saved_state.process_start(self.pid) != start:
                os.close(fd)
                return False
            self._pidfd, self._start = fd, start
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(0)  # readable once the process has exited

    def answers(self, timeout_s: float = PING_S) -> bool:
        """True when krexd answers ``ping`` on its socket, as itself, within ``timeout_s``."""
        if not self.socket:
            return False
        try:
            from krex_client.connection import Connection, KrexUnavailable, RemoteError
        except ImportError:
            return False
        try:
            conn = Connection(self.socket, timeout_s=timeout_s)
        except Exception:  # noqa: BLE001 - no socket, no ZeroMQ: not answering
            return False
        try:
            return int(conn.request("ping").get("pid", -1)) == self.pid
        except (KrexUnavailable, RemoteError, ValueError, TypeError):
            return False
        finally:
            conn.close()

    def close(self) -> None:
        """Close the pidfd."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _thaw_all(tree: str, gates: list[str], hb_pid: int, hb_ns: int) -> None:
    """Thaw first, then unlock (the driver never returns for a frozen process), reopen."""
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


def watch(
    heartbeat: str,
    tree: str,
    gates: list[str],
    bound_s: float,
    pid: int,
    socket: str | None = None,
) -> int:
    """The watchdog's loop (docs/design/daemon.md "Restarts"); returns the exit code."""
    limit_ns = int(max(0.5, bound_s - 1.0) * 1e9)
    krexd = Watched(pid, socket)
    thawed_for: int | None = None  # heartbeat time of the last thaw
    spared_for: int | None = None  # heartbeat time a live krexd was last spared for
    while True:
        hb = read_heartbeat(heartbeat)
        if hb is None:
            if not os.path.exists(heartbeat):
                return 0  # krexd stopped and removed it
            time.sleep(POLL_S)
            continue
        hb_pid, hb_start, hb_ns = hb
        if hb_pid == pid:
            owner_alive = krexd.alive(hb_start)
        else:
            owner_alive = saved_state.process_start(hb_pid) == hb_start
            if owner_alive:
                return 0  # a successor krexd runs its own watchdog
        if boottime_ns() - hb_ns > limit_ns and thawed_for != hb_ns:
            if owner_alive and hb_pid == pid and krexd.answers():
                if spared_for != hb_ns:  # alive, its heartbeat not written: once per stall
                    spared_for = hb_ns
                    _log.error(
                        "krexd (pid %d) has not beaten for %.1f s but answers: not thawing",
                        pid,
                        (boottime_ns() - hb_ns) / 1e9,
                    )
            else:
                thawed_for = hb_ns
                _thaw_all(tree, gates, hb_pid, hb_ns)
        if thawed_for == hb_ns and not owner_alive and not _tenants_left(tree):
            return 0
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    """``python -m krexd.restarts.watchdog --heartbeat F --tree DIR --bound S --pid P [--socket S]
    [--gate G]...``."""
    p = argparse.ArgumentParser(prog="krexd-watchdog", description=__doc__.splitlines()[0])
    p.add_argument("--heartbeat", required=True)
    p.add_argument("--tree", required=True)
    p.add_argument("--bound", type=float, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--gate", action="append", default=[])
    p.add_argument("--socket", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="krexd-watchdog: %(message)s")
    return watch(args.heartbeat, args.tree, args.gate, args.bound, args.pid, args.socket)


if __name__ == "__main__":
    sys.exit(main())
