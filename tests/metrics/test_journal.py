"""krexd's log records as journald native-protocol datagrams with structured fields.

A datagram socket stands in for journald's (``KREX_JOURNAL_SOCKET``); the
last test runs a real krexd that logs there (``KREX_LOG_JOURNAL=1``) and
finds ``EVENT=admitted`` with the tenant and GPU of a ``krex run``.
"""

from __future__ import annotations

import array
import logging
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from krexd.system.journal import JournalHandler, encode, log_fields, under_journal


def parse(data: bytes) -> dict[str, str]:
    """One native-protocol datagram into its fields (the binary form included)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            out[key.decode()] = value.decode()
            i = nl + 1
        else:
            (size,) = struct.unpack_from("<Q", data, nl + 1)
            start = nl + 9
            out[line.decode()] = data[start : start + size].decode()
            i = start + size + 1
    return out


@pytest.fixture
def journal(tmp_path: Any) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "journal.sock"))
    sock.settimeout(5)
    yield sock
    sock.close()


def receive(sock: socket.socket) -> dict[str, str]:
    """One record: a datagram, or the memfd a large record came in."""
    fds = array.array("i")
    data, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4))
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[:4])
    if fds:
        with os.fdopen(fds[0], "rb") as f:
            data = os.pread(f.fileno(), os.fstat(f.fileno()).st_size, 0)  # as journald reads
    return parse(data)


def test_record_carries_fields(journal: socket.socket) -> None:
    handler = JournalHandler(journal.getsockname())
    log = logging.getLogger("krexd.test_journal")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.DEBUG)
    try:
        log.warning("t%d ended", 42, extra=log_fields("command_ended", 42, 1, 7, "drain_timeout"))
        fields = receive(journal)
        assert fields["MESSAGE"] == "t42 ended"
        assert fields["PRIORITY"] == "4"
        assert fields["SYSLOG_IDENTIFIER"] == "krexd"
        assert (fields["TENANT"], fields["GPU"], fields["EPOCH"]) == ("42", "1", "7")
        assert (fields["EVENT"], fields["REASON"]) == ("command_ended", "drain_timeout")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("multi\nline")
        fields = receive(journal)
        assert fields["MESSAGE"].startswith("multi\nline\nTraceback")
        assert "TENANT" not in fields
        log.info("x" * 300_000)  # larger than a datagram: sent in a sealed memfd
        assert receive(journal)["MESSAGE"] == "x" * 300_000
    finally:
        log.removeHandler(handler)
        handler.close()


def test_encode_and_journal_stream(tmp_path: Any, monkeypatch: Any) -> None:
    assert encode({"A": "1", "B": "x\ny"}) == b"A=1\nB\n" + struct.pack("<Q", 3) + b"x\ny\n"
    path = tmp_path / "stream"
    with open(path, "w") as f:
        st = os.fstat(f.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert under_journal(f)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
        assert not under_journal(f)
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not under_journal()


@pytest.mark.root
def test_krexd_logs_admit_with_fields(krexd_factory: Any, journal: socket.socket) -> None:
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def read() -> None:  # as journald does: the queue of a datagram socket is short
        while not done.is_set():
            try:
                seen.append(receive(journal))
            except (TimeoutError, OSError):
                continue

    journal.settimeout(0.2)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        env = {"KREX_LOG_JOURNAL": "1", "KREX_JOURNAL_SOCKET": journal.getsockname()}
        k = krexd_factory(env=env)
        run = subprocess.run([*k.krex, "run", "--", "true"], env=k.env, capture_output=True)
        assert run.returncode == 0, run.stderr.decode()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(f.get("EVENT") == "ended" for f in seen):
            time.sleep(0.05)
    finally:
        done.set()
        reader.join()
    events = {f.get("EVENT"): f for f in seen if "EVENT" in f}
    assert events["admitted"]["TENANT"] == "1" and events["admitted"]["GPU"] == "0"
    assert events["placed"]["TENANT"] == "1"
    assert events["ended"]["TENANT"] == "1"
    assert all(f["SYSLOG_IDENTIFIER"] == "krexd" for f in seen)
