"""``krexctl top`` in a real terminal (tmux): what it draws, and a clean Ctrl-C.

The view is read back with ``tmux capture-pane``; tmux also says whether the
alternate screen is on and the cursor visible, before and after Ctrl-C.
Skipped where tmux is not installed (``apt-get install tmux``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from krex_cli.top import Events, render
from tests.support.krexd import KREXCTL

PROG = os.path.join(os.path.dirname(__file__), "progs", "regions.py")
TMUX = shutil.which("tmux")


def _status(granted: int, tenants: list[int], ended: int = 0) -> dict[str, Any]:
    return {
        "version": "0",
        "pid": 1,
        "uptime_s": 5.0,
        "queue": {"parked": 0},
        "tenants": [{"id": t, "gpu": 0} for t in tenants],
        "gpus": [
            {
                "index": 0,
                "holder": tenants[0] if tenants else None,
                "slots_used": len(tenants),
                "slots_total": 4,
                "region": {
                    "queue_length": 1,
                    "regions": {"granted": granted, "refused": {}},
                    "commands_ended": {"drain_timeout": ended},
                    "recent_entry_ms": {"n": granted, "p50": 0.5, "p99": 1.25},
                },
            }
        ],
    }


def test_render_and_events() -> None:
    events = Events()
    events.update(_status(0, []), "10:00:00")
    events.update(_status(3, [7], ended=1), "10:00:01")
    screen = render(_status(3, [7], ended=1), events, None)
    assert "0.50/1.25 (n=3)" in screen
    assert "t7 admitted on gpu0" in screen
    assert "gpu0: 3 region(s) granted, held by t7" in screen
    assert "gpu0: 1 command(s) ended: drain_timeout" in screen
    assert "krexd: no answer" in render(None, events, None)


@pytest.fixture
def tmux(tmp_path: Any) -> Iterator[Callable[..., str]]:
    if TMUX is None:
        pytest.skip("tmux is not installed")
    sock = str(tmp_path / "tmux.sock")

    def run(*args: str) -> str:
        out = subprocess.run([TMUX, "-S", sock, *args], capture_output=True, text=True, timeout=10)
        return out.stdout

    yield run
    subprocess.run([TMUX, "-S", sock, "kill-server"], capture_output=True, timeout=10)


def _wait_for(read: Callable[[], str], want: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    text = read()
    while want not in text and time.monotonic() < deadline:
        time.sleep(0.1)
        text = read()
    assert want in text, text
    return text


@pytest.mark.root
def test_top_in_tmux(krexd_factory: Any, tmux: Callable[..., str]) -> None:
    k = krexd_factory(slots=2)
    top = shlex.join([*KREXCTL, "top", "--socket", k.socket])
    tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "30",
         f"{top}; echo EXIT=$?; sleep 60")  # fmt: skip

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", "top")

    def flags() -> str:
        return tmux("display-message", "-p", "-t", "top", "#{alternate_on} #{cursor_flag}").strip()

    _wait_for(screen, "HOLDER")
    assert flags() == "1 0"  # alternate screen, cursor hidden
    run = subprocess.run(
        [*k.krex, "run", "--", sys.executable, PROG, "3"], env=k.env, capture_output=True
    )
    assert run.returncode == 0, run.stderr.decode()
    text = _wait_for(screen, "region(s) granted")
    assert "(n=3)" in text  # entry p50/p99 over the last minute, 3 regions
    assert "1 command(s) admitted and ended" in text or "t1 admitted on gpu0" in text
    tmux("send-keys", "-t", "top", "C-c")
    _wait_for(screen, "EXIT=0")
    assert flags() == "0 1"  # terminal restored: main screen, cursor shown
