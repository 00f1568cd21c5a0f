"""Nothing waits silently: ``krex run``'s queue line (krex_cli.queued) and a stale socket.

The line is judged over a hand-made ``status`` reply and a fake clock; the
end-to-end path (a real krexd, a full GPU) is in tests/cli/test_run.py.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import tempfile
import time
from typing import Any

import pytest

from krex_cli.queued import FIRST_S, REFRESH_S, QueueNotice, describe
from krex_client.errors import ExitCode
from tests.support.krexd import KREX


def _status(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "gpus": [
            {"index": 0, "slots_used": 2, "slots_total": 2},
            {"index": 1, "slots_used": 4, "slots_total": 4},
        ],
        "queue": {"parked": len(rows), "queue": rows},
    }


def _row(pid: int, **kw: Any) -> dict[str, Any]:
    return {"launcher_pid": pid, "gpu": None, "exclusive": False, "waiting_for": "slot", **kw}


def test_describe_says_the_place_and_what_it_waits_for() -> None:
    me = os.getpid()
    rows = [_row(1), _row(me, gpu=1), _row(2)]
    assert describe(_status(rows), me, 1) == (
        "queued: 2 of 3 parked requests; waiting for a free slot on GPU 1 (4 of 4 in use)"
    )
    assert describe(_status([_row(me)]), me, None) == (
        "queued: 1 of 1 parked request; waiting for a free slot on any GPU (6 of 6 in use)"
    )
    memory = _row(me, waiting_for="memory", mem_gpu=0, mem_bytes=3 << 30)
    assert describe(_status([memory]), me, None).endswith("3.0 GiB of GPU memory on GPU 0")
    exclusive = _row(me, gpu=0, exclusive=True)
    assert describe(_status([exclusive]), me, 0).endswith("GPU 0 to have no tenants (--exclusive)")


def test_describe_without_krexds_word_still_says_what_it_waits_for() -> None:
    assert describe(None, os.getpid(), 3) == "queued: waiting for a free slot on GPU 3"
    redacted = _status([{"gpu": None, "exclusive": False, "redacted": True}])
    assert describe(redacted, os.getpid(), None) == "queued: waiting for a free slot on any GPU"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _notice(terminal: bool, verbose: bool) -> tuple[QueueNotice, io.StringIO, _Clock, list[int]]:
    out, clock, asked = io.StringIO(), _Clock(), []

    def status() -> dict[str, Any]:
        asked.append(1)
        first = [_row(1)] if len(asked) < 3 else []
        return _status([*first, _row(os.getpid(), gpu=0)])

    notice = QueueNotice(status, 0, terminal=terminal, verbose=verbose, stream=out, clock=clock)
    return notice, out, clock, asked


def test_on_a_terminal_one_line_after_a_second_updated_in_place() -> None:
    notice, out, clock, asked = _notice(terminal=True, verbose=False)
    notice.poll()
    clock.now += FIRST_S * 0.9
    notice.poll()
    assert out.getvalue() == "" and not asked  # under a second: nothing, krexd not asked
    clock.now += FIRST_S * 0.2
    notice.poll()
    assert out.getvalue().startswith("\rkrex: queued: 2 of 2 parked requests; waiting for")
    clock.now += REFRESH_S / 2
    notice.poll()
    assert len(asked) == 1  # not before REFRESH_S
    for _ in range(2):
        clock.now += REFRESH_S
        notice.poll()
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") == 3 and "(6 s)" in text
    assert "queued: 1 of 1 parked request;" in text.rsplit("\r", 1)[1]
    notice.done()
    notice.done()
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1


def test_off_a_terminal_silent_unless_verbose_then_a_line_per_change() -> None:
    notice, out, clock, asked = _notice(terminal=False, verbose=False)
    for _ in range(5):
        clock.now += REFRESH_S
        notice.poll()
    notice.done()
    assert out.getvalue() == "" and not asked
    notice, out, clock, asked = _notice(terminal=False, verbose=True)
    for _ in range(5):
        clock.now += REFRESH_S
        notice.poll()
    notice.done()
    lines = out.getvalue().splitlines()
    assert len(asked) == 5 and len(lines) == 2, lines  # two texts: 2 of 2, then 1 of 1
    assert lines[0].startswith("krex: queued: 2 of 2") and lines[1].startswith(
        "krex: queued: 1 of 1"
    )


@pytest.mark.slow  # krex run waits STALE_WAIT_S (10 s) for a restarting krexd to rebind
def test_a_stale_socket_is_unreachable_at_once() -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="krex-"), "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens (a krexd that crashed)
    started = time.monotonic()
    p = subprocess.run(
        [*KREX, "run", "--socket", path, "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 20
    assert p.returncode == ExitCode.UNAVAILABLE == 69, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and path in lines[0] and "krexd is not running" in lines[0], lines
