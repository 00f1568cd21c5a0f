"""The replay's warm/cold start records and their report section (no krexd)."""

from __future__ import annotations

import math
from pathlib import Path

from krex_cli.replay import starts
from krex_cli.warm import launch


def test_which_commands_ask_for_warm_starts() -> None:
    assert starts.asks_warm("auto", 0, 1) is None  # krexd's [warm] start decides
    assert starts.asks_warm("off", 0, 1) is False
    assert starts.asks_warm("on", 0, 0)
    assert [starts.asks_warm("alternate", p, i) for p in (0, 1) for i in (0, 1)] == [
        False,
        True,
        True,
        False,
    ]


def test_outcome_from_krex_run_debug_lines() -> None:
    served = "x\nkrex: warm: served by pool /p.sock (pid 9)\n"
    assert starts.outcome(True, served) == {"asked": True, "served": True, "why": None}
    cold = "krex: warm: cold start: no pool listens on /p.sock\nkrex: warm: starting a pool\n"
    assert starts.outcome(True, cold)["why"] == "no pool listens on /p.sock"
    assert starts.outcome(False, served) == {"asked": False, "served": False, "why": None}
    # No flag: krexd decided, and krex run -v says how it went either way.
    assert starts.outcome(None, served) == {"asked": "krexd", "served": True, "why": None}
    krexd_cold = 'krex: warm: cold start: krexd\'s [warm] start is "cold"\n'
    assert starts.outcome(None, krexd_cold)["why"] == 'krexd\'s [warm] start is "cold"'
    assert starts.outcome(None, "")["why"] == "no debug line"


def test_no_pool_reasons_say_why_there_was_none() -> None:
    """ "no pool listens on PATH" is followed by why; the report groups by that, not PATH."""
    first = "krex: warm: cold start: no pool listens on /k1.sock (No such file or directory)\n"
    started = first + "krex: warm: starting a pool for this command (log /k1.log)\n"
    assert starts.outcome(None, started)["why"] == "no pool yet: this command started one"
    starting = first + "krex: warm: a pool for this command is starting\n"
    assert starts.outcome(True, starting)["why"] == "no pool yet: one is starting"
    refused = first + "krex: warm: the last pool for this key refused to serve: mem\n"
    assert starts.outcome(None, refused)["why"] == "the last pool refused to serve: mem"
    assert starts.outcome(None, first)["why"].startswith("no pool listens on /k1.sock")


def test_no_pool_reasons_match_what_krex_run_writes() -> None:
    """Each line the report reads is one krex run -v writes (krex_cli/warm/launch.py)."""
    source = (Path(launch.__file__)).read_text(encoding="utf-8")
    for prefix, _why in starts.NO_POOL_BECAUSE:
        assert f'debug(f"{prefix.removeprefix("krex: warm: ")}' in source or (
            f'debug("{prefix.removeprefix("krex: warm: ")}' in source
        ), prefix


def test_run_flags() -> None:
    assert starts.run_flags(None) == ["-v"]
    assert starts.run_flags(True) == ["--warm", "-v"]
    assert starts.run_flags(False) == ["--cold"]


def test_summary_and_section() -> None:
    def rec(served: bool, wall: float, imports: float, code: int = 0, why: str = "x") -> dict:
        w = {"asked": True, "served": served, "why": None if served else why}
        return {
            "warm": w,
            "exit_code": code,
            "wall_s": wall,
            "result": {"phases": {"imports_ms": imports}},
        }

    records = [
        rec(True, 1.0, 10.0),
        rec(True, 3.0, 30.0),
        rec(False, 9.0, 900.0),
        rec(False, 0.1, 1.0, code=1),
    ]
    s = starts.summarize(records)
    assert s["warm"] == {"commands": 2, "wall_s_median": 2.0, "imports_ms_median": 20.0}
    assert s["cold"]["commands"] == 1 and s["cold"]["imports_ms_median"] == 900.0
    assert s["cold_reasons"] == {"x": 2} and s["asked"] == 4 and s["started"] == 4
    md = "\n".join(starts.markdown({"r": s}))
    assert "## Warm and cold starts" in md and "| r | 2 | 1 |" in md
    assert "| r | x | 2 |" in md
    empty = starts.summarize([{"exit_code": 0, "wall_s": 1.0}])
    assert empty["started"] == 0 and math.isnan(empty["warm"]["wall_s_median"])
    assert starts.markdown({"r": empty}) == []


def test_section_of_starts_krexd_decided() -> None:
    """``--warm auto``: nothing asked, yet the section shows how krexd's default went."""
    err = {True: "krex: warm: served by pool /p (pid 1)\n", False: "krex: warm: cold start: y\n"}
    records = [
        {"warm": starts.outcome(None, err[served]), "exit_code": 0, "wall_s": 1.0}
        for served in (True, True, False)
    ]
    s = starts.summarize(records)
    assert (s["asked"], s["krexd"], s["started"]) == (0, 3, 3)
    assert s["warm"]["commands"] == 2 and s["cold"]["commands"] == 1
    assert s["cold_reasons"] == {"y": 1}
    md = "\n".join(starts.markdown({"auto": s}))
    assert "| auto | 2 | 1 |" in md and "| auto | y | 1 |" in md


def test_a_median_of_no_commands_is_a_dash_not_nan() -> None:
    records = [
        {"warm": {"asked": True, "served": True, "why": None}, "exit_code": 0, "wall_s": 1.0}
    ]
    md = "\n".join(starts.markdown({"r": starts.summarize(records)}))
    assert "nan" not in md and "| r | 1 | 0 | 1.00 | — | — | — |" in md
