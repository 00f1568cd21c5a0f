"""sd_notify for krexd under systemd (``Type=notify``): READY, STATUS, WATCHDOG, STOPPING.

The ``sdnotify`` package sends datagrams to ``$NOTIFY_SOCKET`` but neither
reads ``WATCHDOG_USEC``/``WATCHDOG_PID`` nor removes them from the
environment.  :meth:`Notifier.from_env` does both: it reads the three
variables and deletes them from ``os.environ`` so no child (and no tenant)
inherits them.  The watchdog is pinged from the event loop at half of
``WATCHDOG_USEC`` (sd_watchdog_enabled(3)), so a wedged loop trips it.
"""

from __future__ import annotations

import asyncio
import logging
import os

import sdnotify

_log = logging.getLogger("krexd.notify")

ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends sd_notify messages when ``socket`` (``$NOTIFY_SOCKET``) is set; else does nothing.

    ``watchdog_usec``: the watchdog period in µs (``$WATCHDOG_USEC``), or None.
    """

    def __init__(self, socket: str | None, watchdog_usec: int | None) -> None:
        self.socket = socket
        self.watchdog_usec = watchdog_usec
        self._impl: sdnotify.SystemdNotifier | None = None
        if socket:
            saved = os.environ.get("NOTIFY_SOCKET")
            os.environ["NOTIFY_SOCKET"] = socket
            try:
                self._impl = sdnotify.SystemdNotifier()
            finally:
                if saved is None:
                    os.environ.pop("NOTIFY_SOCKET", None)

    @classmethod
    def from_env(cls) -> Notifier:
        """Read and strip ``NOTIFY_SOCKET``, ``WATCHDOG_USEC``, ``WATCHDOG_PID``."""
        socket = os.environ.get("NOTIFY_SOCKET") or None
        usec: int | None = None
        raw_usec = os.environ.get("WATCHDOG_USEC", "")
        raw_pid = os.environ.get("WATCHDOG_PID", "")
        if raw_usec.isdigit() and int(raw_usec) > 0:
            # WATCHDOG_PID, when set, must name us (sd_watchdog_enabled(3)).
            if not raw_pid or (raw_pid.isdigit() and int(raw_pid) == os.getpid()):
                usec = int(raw_usec)
        for var in ENV_VARS:
            os.environ.pop(var, None)
        return cls(socket, usec)

    @property
    def enabled(self) -> bool:
        """True when messages go somewhere."""
        return self._impl is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half the period), or None without a watchdog."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec and self.enabled else None

    def send(self, message: str) -> None:
        """Send one notify message (e.g. ``"READY=1"``); newlines in STATUS are flattened."""
        if self._impl is not None:
            self._impl.notify(message)

    def ready(self, status: str) -> None:
        """READY=1 with a STATUS line: krexd serves requests now."""
        self.send(f"READY=1\nSTATUS={status.replace(chr(10), ' ')}")

    def status(self, status: str) -> None:
        """A STATUS= line for ``systemctl status``."""
        self.send(f"STATUS={status.replace(chr(10), ' ')}")

    def stopping(self) -> None:
        """STOPPING=1: shutdown has begun."""
        self.send("STOPPING=1")

    async def watchdog_loop(self) -> None:
        """Ping WATCHDOG=1 every :attr:`watchdog_interval_s` seconds until cancelled."""
        interval = self.watchdog_interval_s
        if interval is None:
            return
        _log.info("watchdog: pinging every %.3f s", interval)
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(interval)
