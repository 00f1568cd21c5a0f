"""``region.critical()``: mark the code whose timing must run alone on the GPU.

Paper §4.1: the author marks the measurement; krex establishes exclusivity
for it at run time (docs/design/architecture.md "The region protocol, step
by step": this module sends ``region_enter`` and ``region_exit`` and calls
the shim's holder side around the code).  Off krex it does nothing and
warns once; regions are re-entrant within a thread.  pyzmq and msgpack are
imported only when it first talks to krexd.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from krex_client import region_steps, warmup
from krex_client.request_ids import RequestIds
from krex_client.shim_binding import Shim

if TYPE_CHECKING:
    from krex_client.connection import Connection
    from krex_client.devicestate import DeviceState
    from krex_client.record import Recorder


class ControlConnection(Protocol):
    """What a region needs of a control-plane connection (``Connection`` has it)."""

    def request(
        self,
        op: str,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        *,
        forever: bool = False,
    ) -> dict[str, Any]:
        """Send ``op`` and return the reply body (see ``Connection.request``)."""
        ...


def _connect_from_env() -> ControlConnection:
    """A ``Connection`` from ``KREX_SOCKET``/``KREX_TENANT``/``KREX_TOKEN``.

    pyzmq and msgpack are imported here, on the first region under krex.
    """
    try:
        from krex_client.connection import Connection
    except ImportError as exc:
        raise RegionError(
            f"talking to krexd needs pyzmq and msgpack ({exc}); "
            "install krex-client with its dependencies"
        ) from None
    conn: Connection = Connection.from_env()
    return conn


def _reconnect_s() -> float:
    """Seconds a region request waits for a restarted krexd (``KREX_RECONNECT_S``)."""
    try:
        return max(0.0, float(os.environ.get("KREX_RECONNECT_S", "120")))
    except ValueError:
        return 120.0


def _close(conn: ControlConnection | None) -> None:
    """Close ``conn`` if it has a ``close`` (a real ``Connection`` does); errors ignored."""
    close = getattr(conn, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - already broken: nothing more to release
            pass


class RegionError(RuntimeError):
    """krexd refused or aborted a critical region (the message says why)."""


class Region:
    """Critical regions of this process (one at a time)."""

    def __init__(self, connect: Callable[[], ControlConnection] = _connect_from_env) -> None:
        # ``connect`` opens the control connection (once per process); tests pass a fake.
        self.connect = connect
        self._local = threading.local()  # .depth: this thread's nesting of critical()
        self._hold = threading.Lock()  # held by the thread whose region is active
        self._warned = False
        self._stats: dict[str, float] = self._zero_stats()
        self._shim: Shim | None = None
        self._conn: ControlConnection | None = None
        self._conn_pid = 0
        self._recorder: Recorder | None = None  # the region log's (KREX_REGION_LOG)
        self._recorder_pid = 0
        self._daemon_pid: int | None = None  # the krexd that answers (a restart changes it)
        self._device: DeviceState | None = None  # this process's, shared by warm-up and record
        self._device_pid = 0
        self._ids = RequestIds()  # each region request's id: krexd runs it once

    @staticmethod
    def _zero_stats() -> dict[str, float]:
        return {
            "entry_ms": 0.0,
            "wait_ms": 0.0,
            "drain_ms": 0.0,
            "freeze_ms": 0.0,
            "check_ms": 0.0,
            "region_ms": 0.0,
            "sync_ms": 0.0,
            "launches": 0.0,
            "l2_flushed": 0.0,
            "warmup_ms": 0.0,
            "contaminated": 0.0,
        }

    @staticmethod
    def under_krex() -> bool:
        """True when this process runs under ``krex run``."""
        return all(os.environ.get(k) for k in ("KREX_SOCKET", "KREX_TENANT", "KREX_TOKEN"))

    def inside(self) -> bool:
        """True while the calling thread runs inside ``critical()`` (explicit or auto).

        Counts the thread's open ``critical()`` calls whether or not this
        process runs under krex (off krex a region is a no-op, but still open).
        """
        return getattr(self._local, "depth", 0) > 0

    def busy(self) -> bool:
        """True while some thread of this process holds a region under krex."""
        return self._hold.locked()

    def stats(self) -> dict[str, float]:
        """Figures of the last region, in ms (launches: a count).

        Keys: entry_ms (request to grant), wait_ms (waiting for the region
        lock), drain_ms, freeze_ms (with check_ms, krexd's fail-closed check
        that ends the freeze step), region_ms (grant to exit), sync_ms (the
        holder's own GPU work at exit), launches, l2_flushed (1 when the
        shim flushed L2 at entry, 0 when it did not, whatever the grant
        asked), warmup_ms (the clock warm-up after the grant, inside the
        region: :mod:`krex_client.warmup`).  ``launches`` leaves out the
        warm-up's own.  All zero outside krex.
        """
        return dict(self._stats)

    @contextmanager
    def critical(self, warm: warmup.Policy | None = None) -> Iterator[None]:
        """Run the enclosed code as this GPU's only tenant (paper §4.2).

        Nested use in the thread that holds the region does nothing more; another
        thread of the process waits until that region ends, then enters its own.

        Args:
            warm: the clock warm-up after the grant; default
                ``warmup.Policy.from_env()`` (``KREX_REGION_WARM_*``).  Ignored
                when nested.

        Raises:
            RegionError: krexd refused the region (drain or freeze timeout,
                the command is not a krex tenant, ...) or ended it early.
            krex_client.connection.KrexUnavailable: krexd cannot be reached.
        """
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            if depth > 0:  # nested in this thread's region
                yield
                return
            if not self.under_krex():
                self._warn_once()
                yield
                return
            # One region per process at a time (krexd has one per tenant): a second
            # thread waits here for the first thread's region to end, then gets its own.
            with self._hold:
                yield from self._run_region(warm)
        finally:
            self._local.depth = depth

    def _run_region(self, warm_policy: warmup.Policy | None) -> Iterator[None]:
        conn = self._connection()
        policy = warm_policy if warm_policy is not None else warmup.Policy.from_env()
        recorder = self._region_log(policy)  # NVML opened here, before the region
        t0 = time.monotonic()
        try:
            body = {"pid": os.getpid(), "tid": threading.get_native_id(), **self._ids.fields()}
            grant = self._request(conn, "region_enter", body)
        except RegionError:
            raise
        except BaseException:
            # Interrupted while parked (Ctrl-C, a harness's alarm): krexd would still
            # grant the region and keep the siblings frozen for nobody.  Withdraw it.
            self._cancel(self._connection())
            raise
        if self._shim is None:
            self._shim = Shim()
        try:
            flushed = self._shim.region_begin(
                int(grant["epoch"]), bool(grant.get("l2_flush", True))
            )
        except BaseException:
            self._request(
                self._connection(),
                "region_exit",
                {"epoch": grant["epoch"], "sync_ms": 0.0, "launches": 0, **self._ids.fields()},
            )
            raise
        granted = time.monotonic()
        entry = recorder.sample() if recorder is not None else {}
        warm = warmup.Result(0.0, entry.get("sm_clock_mhz"))
        warm_launches = 0
        try:
            warm, warm_launches = region_steps.warm_up(self._shim, self._device_view, policy, entry)
            yield
        finally:
            sync_ms, launches = self._shim.region_end()
            launches = max(0, launches - warm_launches)  # the region's code's own
            exit_ = recorder.sample() if recorder is not None else {}
            reply = self._request(
                self._connection(),  # a restart during the region replaced the entry's
                "region_exit",
                {"epoch": grant["epoch"], "sync_ms": sync_ms, "launches": launches}
                | self._ids.fields(),
            )
            self._stats = {
                "entry_ms": (granted - t0) * 1e3,
                "wait_ms": float(grant.get("wait_ms", 0.0)),
                "drain_ms": float(grant.get("drain_ms", 0.0)),
                "freeze_ms": float(grant.get("freeze_ms", 0.0)),
                "check_ms": float(grant.get("check_ms", 0.0)),
                "region_ms": float(reply.get("region_ms", 0.0)),
                "sync_ms": sync_ms,
                "launches": float(launches),
                "l2_flushed": 1.0 if flushed else 0.0,
                "warmup_ms": warm.ms,
                "contaminated": 1.0 if (reply.get("witness") or {}).get("contaminated") else 0.0,
            }
            _warn_contaminated(grant, reply)
            if recorder is not None:
                samples, warmed = (entry, exit_), (warm, warm_launches, policy)
                region_steps.log(recorder, self._shim, self._stats, grant, reply, samples, warmed)

    def _device_view(self) -> DeviceState:
        """This process's view of its GPU (opened once per process; nulls without its library)."""
        if self._device is None or self._device_pid != os.getpid():
            from krex_client.devicestate import open_state

            self._device, self._device_pid = open_state(), os.getpid()
        return self._device

    def _region_log(self, policy: warmup.Policy) -> Recorder | None:
        """The region log's recorder when ``KREX_REGION_LOG`` is set (one per process).

        Also opens the GPU's management library (NVML or AMD SMI), before the
        region, when the clock warm-up may use it.
        """
        from krex_client import record

        if policy.budget_ms > 0:
            self._device_view()
        path = record.log_path()
        if path is None:
            return None
        if self._recorder is None or self._recorder_pid != os.getpid():
            state = self._device_view()
            self._recorder, self._recorder_pid = record.Recorder(path, state), os.getpid()
        return self._recorder

    @staticmethod
    def _cancel(conn: ControlConnection) -> None:
        """Best effort ``region_cancel`` (the interruption propagates regardless)."""
        try:
            conn.request("region_cancel", {}, timeout_s=5.0)
        except Exception:  # noqa: BLE001 - krexd gone or refusing: nothing more to do
            pass

    def _connection(self) -> ControlConnection:
        # One connection per process; a forked child opens its own.
        if self._conn is None or self._conn_pid != os.getpid():
            self._daemon_pid = None
            self._conn = self.connect()
            self._conn_pid = os.getpid()
        return self._conn

    def _request(self, conn: ControlConnection, op: str, body: dict[str, Any]) -> dict[str, Any]:
        # region_enter is parked in krexd while another tenant holds the region:
        # wait as long as it takes (krexd bounds drain and freeze itself).  When krexd
        # restarts meanwhile, the request is sent again to the krexd that adopted this
        # command (``KREX_RECONNECT_S``, default 120 s): a re-sent enter of a region
        # already granted is granted again, a re-sent exit of one ended is answered again.
        # Every copy has one request id: krexd answers a duplicate with the first's reply.
        deadline: float | None = None
        while True:
            try:
                return self._send(conn, op, body)
            except Exception as exc:
                # RemoteError/KrexUnavailable come from a loaded connection module;
                # importing it here just to compare would pull in pyzmq.
                connection = sys.modules.get("krex_client.connection")
                if connection is not None and isinstance(exc, connection.RemoteError):
                    if self._ids.refused(exc.name, exc.message, body):
                        continue  # a krexd older than request ids: the same request without
                    raise RegionError(f"{op}: {exc.name}: {exc.message}") from None
                if connection is None or not isinstance(exc, connection.KrexUnavailable):
                    raise
                if deadline is None:
                    deadline = time.monotonic() + _reconnect_s()
                conn = self._reconnect(deadline, exc)

    def _send(self, conn: ControlConnection, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """``conn.request(op, body, forever=True)``; a real connection also gives up when
        the krexd that took the request exits (a fast restart would never answer it)."""
        connection = sys.modules.get("krex_client.connection")
        if connection is None or not isinstance(conn, connection.Connection):
            return conn.request(op, body, forever=True)
        if self._daemon_pid is None:
            self._daemon_pid = int(conn.request("ping", {})["pid"])
        pid, socket = self._daemon_pid, conn.socket

        def krexd_alive() -> None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise connection.KrexUnavailable(socket, "krexd exited") from None
            except PermissionError:
                pass  # alive, owned by root

        reply: dict[str, Any] = conn.request(op, body, forever=True, check=krexd_alive)
        return reply

    def _reconnect(self, deadline: float, lost: Exception) -> ControlConnection:
        """A fresh connection to the krexd that answers ``ping`` before ``deadline``."""
        delay = 0.05
        while time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            conn: ControlConnection | None = None
            try:
                conn = self.connect()
                pid = int(conn.request("ping", {})["pid"])
            except Exception:  # noqa: BLE001 - not back yet
                _close(conn)  # each attempt's connection holds a ZeroMQ context and its threads
                continue
            if self._conn_pid == os.getpid():
                _close(self._conn)  # the lost one (a forked child's is its parent's: left)
            self._daemon_pid = pid
            self._conn, self._conn_pid = conn, os.getpid()
            return conn
        raise lost

    def _warn_once(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                "krex_client: not running under `krex run`; region.critical() does nothing",
                RuntimeWarning,
                stacklevel=4,
            )


# ``from krex_client import region`` gives this module; these make
# ``region.critical()`` and ``region.stats()`` work on it directly.
region = Region()
critical = region.critical
stats = region.stats
under_krex = Region.under_krex


def _warn_contaminated(grant: dict[str, Any], reply: dict[str, Any]) -> None:
    """One warning on stderr when krexd's witness saw others' GPU work in the region."""
    witness = reply.get("witness") or {}
    if not witness.get("contaminated"):
        return
    names = ", ".join(f"pid {o.get('pid')} ({o.get('command')})" for o in witness.get("others", []))
    warnings.warn(
        f"krex: region (epoch {grant.get('epoch')}) was contaminated: {names} ran GPU work "
        "inside it; its timing was not exclusive",
        RuntimeWarning,
        stacklevel=3,
    )
