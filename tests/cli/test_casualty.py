"""``krex run``'s re-runs after GPU-wide faults (krex_cli.casualty), without krexd.

The end-to-end path (real krexd, fake MPS server) is tests/mps/test_faults.py;
here the decisions alone: who is run again, how, how often, and what exit
code comes out.
"""

from __future__ import annotations

from typing import Any

import pytest

from krex_cli import casualty
from krex_client.errors import ExitCode


def _reply(role: str | None, kill_reason: str | None = None) -> dict[str, Any]:
    fault = None if role is None else {"role": role, "gpu": 0, "error": 700, "why": "test"}
    return {"kill_reason": kill_reason, "gpu_fault": fault}


def test_judge_raises_only_for_failed_casualties_and_suspects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    casualty.judge(["cmd"], 0, _reply("casualty"))  # succeeded anyway
    casualty.judge(["cmd"], 1, _reply(None))  # no GPU-wide fault: its own failure
    casualty.judge(["cmd"], 1, _reply("casualty", kill_reason="max_region_s"))
    casualty.judge(["cmd"], 1, _reply("culprit"))
    assert "its own kernel faulted GPU 0 (CUDA_ERROR_ILLEGAL_ADDRESS" in capsys.readouterr().err
    for role in ("casualty", "suspect"):
        with pytest.raises(casualty.Casualty) as info:
            casualty.judge(["cmd"], 1, _reply(role))
        assert info.value.role == role and info.value.code == 1


def _attempts(*outcomes: str | int) -> tuple[list[bool], Any]:
    calls: list[bool] = []

    def attempt(without_mps: bool) -> int:
        calls.append(without_mps)
        o = outcomes[len(calls) - 1]
        if isinstance(o, str):
            raise casualty.Casualty(1, _reply(o)["gpu_fault"])
        return o

    return calls, attempt


def test_a_casualty_runs_again_as_asked_and_ends_with_the_reruns_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls, attempt = _attempts("casualty", 0)
    assert casualty.with_reruns(["cmd"], attempt, 2) == 0
    assert calls == [False, False]
    err = capsys.readouterr().err
    assert "running it again (re-run 1 of 2)" in err
    assert casualty.summary(err, 0) == {"role": "casualty", "reruns": 1}


def test_a_suspect_runs_again_without_mps_and_its_own_failure_stands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls, attempt = _attempts("suspect", 3)
    assert casualty.with_reruns(["cmd"], attempt, 2) == 3
    assert calls == [False, True]
    err = capsys.readouterr().err
    assert "running it without MPS" in err
    assert casualty.summary(err, 3) == {"role": "culprit", "reruns": 1}


def test_used_up_reruns_exit_76(capsys: pytest.CaptureFixture[str]) -> None:
    calls, attempt = _attempts("casualty", "casualty", "casualty")
    assert casualty.with_reruns(["cmd"], attempt, 2) == ExitCode.FAULT_CASUALTY == 76
    assert len(calls) == 3
    assert "2 re-run(s) used up: exit 76" in capsys.readouterr().err
    calls, attempt = _attempts("casualty")
    assert casualty.with_reruns(["cmd"], attempt, 0) == 76
    assert calls == [False]


def test_no_fault_lines_no_summary() -> None:
    assert casualty.summary("krex: krexd killed the command: x\n", 1) is None


def test_exit_codes_do_not_collide() -> None:
    # IntEnum makes a repeated value an alias silently: 76 must stay its own code.
    values = [int(v) for v in ExitCode.__members__.values()]
    assert len(values) == len(set(values))
    assert ExitCode(76) is ExitCode.FAULT_CASUALTY and ExitCode(75) is ExitCode.TEMPFAIL


class _Conn:
    """Stands in for krex_cli.reconnect.Reconnecting: ping says krexd's retry default."""

    def __init__(self, socket: str, **_kw: Any) -> None:
        self.socket = socket
        self.closed = False

    def first_ping(self) -> dict[str, Any]:
        return {"retry_tempfail": 1, "cache": {"enabled": False}}

    def close(self) -> None:
        self.closed = True


def test_krex_run_layers_fault_reruns_over_tempfail_retries(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from krex_cli import run as run_mod

    # One run each: a suspect of a fault, then (without MPS) 75 twice, then 0.
    outcomes: list[str | int] = ["suspect", 75, 75, 0]
    calls: list[tuple[bool, str | None]] = []

    def one_run(
        conn: Any,
        argv: list[str],
        gpu: Any,
        timeout_s: Any,
        exclusive: bool,
        mem_bytes: Any = None,
        label: str | None = None,
        warm: Any = None,
        grant_log: str | None = None,
        without_mps: bool = False,
        cache_env: Any = None,
    ) -> int:
        assert isinstance(conn, _Conn) and not conn.closed  # one connection for every run
        assert not exclusive  # a suspect's re-run is shared, not a whole-device lease
        calls.append((without_mps, label))
        o = outcomes[len(calls) - 1]
        if isinstance(o, str):
            raise casualty.Casualty(1, _reply(o)["gpu_fault"])
        return o

    monkeypatch.setattr(run_mod, "Reconnecting", _Conn)
    monkeypatch.setattr(run_mod, "_run", one_run)
    # --retry-tempfail 1 (krexd's default here): once the suspect runs again
    # without MPS, its exit-75 retry does too, and the second 75 stands.
    assert run_mod.run(["cmd"], "sock", label="L", fault_retries=2) == 75
    assert calls == [(False, "L"), (True, "L"), (True, "L")]
    err = capsys.readouterr().err
    assert "running it without MPS (re-run 1 of 2)" in err
    assert "retry 1 of 1 after exit 75" in err
    calls.clear()
    outcomes[:] = ["casualty", 75, 0]
    assert run_mod.run(["cmd"], "sock", retry_tempfail=2, fault_retries=1) == 0
    assert calls == [(False, None), (False, None), (False, None)]
