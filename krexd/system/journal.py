"""krexd's log under systemd: structured journald fields, without a C binding.

Under systemd (``$JOURNAL_STREAM`` names krexd's stderr) each record goes
to journald's native socket with ``TENANT``, ``GPU``, ``EPOCH``, ``EVENT`` and
``REASON`` where the log site passed them (``extra=log_fields(...)``); in
the foreground the plain text on stderr stays.  docs/install.md "The journal".
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import struct
import sys
import traceback
from typing import Any

SOCKET = "/run/systemd/journal/socket"
"""journald's native socket (``$KREX_JOURNAL_SOCKET`` overrides it, for tests)."""

FIELDS = ("TENANT", "GPU", "EPOCH", "EVENT", "REASON")
"""The structured fields krexd's log sites add (``extra=log_fields(...)``)."""

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3}


def log_fields(
    event: str,
    tenant: int | None = None,
    gpu: int | None = None,
    epoch: int | None = None,
    reason: str | None = None,
) -> dict[str, str]:
    """The ``extra=`` mapping of one log record's journald fields (absent ones left out).

    ``event``: a short snake_case name (``admitted``, ``placed``, ``ended``,
    ``region_granted``, ``region_exited``, ``region_recovered``,
    ``command_ended``); ``reason``: a label from a small fixed set (e.g.
    ``krexd.coordinator.region_stats.ENDED_CAUSES``), never free text.
    """
    out = {"EVENT": event}
    for key, value in (("TENANT", tenant), ("GPU", gpu), ("EPOCH", epoch), ("REASON", reason)):
        if value is not None:
            out[key] = str(value)
    return out


def under_journal(stream: Any = None) -> bool:
    """True when ``stream`` (default: stderr) is connected to journald (``$JOURNAL_STREAM``)."""
    raw = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = raw.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def encode(fields: dict[str, str]) -> bytes:
    """One native-protocol datagram: ``KEY=value\\n``, or ``KEY\\n<u64 le len>value\\n``
    for a value with a newline."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalHandler(logging.Handler):
    """A logging handler that sends each record to journald with its fields.

    Each record is one datagram of systemd's "Native Journal Protocol":
    ``MESSAGE``, ``PRIORITY``, ``SYSLOG_IDENTIFIER=krexd``, ``LOGGER``,
    ``CODE_FILE``/``CODE_LINE``/``CODE_FUNC`` and the record's
    :func:`log_fields`; one too large for a datagram goes in a sealed memfd
    passed with ``SCM_RIGHTS``, as libsystemd does.  (``systemd-python``'s
    handler does the same but ships no wheel: it compiles against
    libsystemd's headers.)

    The socket never blocks: when journald's queue is full the record is
    written to stderr as plain text (counted in ``overflowed``).
    ``path``: the native socket (default :data:`SOCKET`, or
    ``$KREX_JOURNAL_SOCKET``); ``identifier``: ``SYSLOG_IDENTIFIER``.
    Errors while sending go to :meth:`logging.Handler.handleError` (never
    raised into the log site).
    """

    def __init__(self, path: str | None = None, identifier: str = "krexd") -> None:
        super().__init__()
        self.path = path or os.environ.get("KREX_JOURNAL_SOCKET") or SOCKET
        self.identifier = identifier
        # Never blocks the event loop: a record journald cannot take now (its queue is
        # full) goes to stderr as plain text instead (the unit's journal stream).
        self._sock = socket.socket(
            socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
        )
        self._plain = logging.Formatter("%(levelname)s %(name)s: %(message)s")
        self.overflowed = 0  # records written to stderr because journald's queue was full

    def fields(self, record: logging.LogRecord) -> dict[str, str]:
        """The journal fields of ``record`` (message with its traceback, if any)."""
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        out = {
            "MESSAGE": message,
            "PRIORITY": str(_PRIORITY.get(record.levelno, 2 if record.levelno > 40 else 6)),
            "SYSLOG_IDENTIFIER": self.identifier,
            "LOGGER": record.name,
            "CODE_FILE": record.pathname,
            "CODE_LINE": str(record.lineno),
            "CODE_FUNC": record.funcName,
        }
        for key in FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = str(value)
        return out

    def emit(self, record: logging.LogRecord) -> None:
        """Send ``record`` (a memfd when it does not fit in a datagram)."""
        try:
            data = encode(self.fields(record))
            try:
                self._sock.sendto(data, self.path)
            except BlockingIOError:
                self.overflowed += 1
                sys.stderr.write(self._plain.format(record) + "\n")
            except OSError as exc:
                if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                    raise
                self._send_memfd(data)
        except Exception:
            self.handleError(record)

    def _send_memfd(self, data: bytes) -> None:
        fd = os.memfd_create("krexd-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))
            self._sock.sendmsg([], [rights], 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()
        super().close()


def setup_logging(level: str, fmt: str) -> logging.Handler:
    """krexd's root log handler at ``level``: the journal under systemd, else ``fmt`` on stderr.

    ``KREX_LOG_JOURNAL=1`` forces the journal, ``0`` stderr.  Returns the handler.
    """
    forced = os.environ.get("KREX_LOG_JOURNAL")
    journal = forced == "1" or (forced != "0" and under_journal())
    handler: logging.Handler
    if journal:
        handler = JournalHandler()
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
