"""Every numeric flag of ``krex``, ``krexctl`` and ``krex replay`` refuses what it cannot use.

An out-of-range value (negative, zero where it must be positive, too large,
``inf``, ``nan``) ends in argparse's usage and one error line naming the flag
(exit 2), never in a traceback later (``krex run --timeout 1e7`` overflowed
``poll(2)``).  In process: the parsers are the commands' own.
"""

from __future__ import annotations

import argparse

import pytest

from krex_cli import argtypes, krexctl
from krex_cli import main as krex_main
from krex_client.errors import ExitCode

RUN = ["run"]
REPLAY = ["replay", "t.jsonl", "--mode", "krex", "--out", "o"]

BAD_KREX = [(RUN, "--timeout", bad) for bad in ("1e7", "inf", "nan", "-1", "0", "1e400", "x")] + [
    (RUN, "--gpu", "65536"),
    (RUN, "--gpu", "-1"),
    (RUN, "--retry-tempfail", "101"),
    (RUN, "--fault-retries", "-1"),
    (RUN, "--fault-retries", "1e3"),
    (RUN, "--die-with", "0"),
    (RUN, "--die-with", "99999999"),
    (REPLAY, "--concurrency", "0"),
    (REPLAY, "--concurrency", "4096"),
    (REPLAY, "--duration", "inf"),
    (REPLAY, "--duration", "nan"),
    (REPLAY, "--repeat", "0"),
    (REPLAY, "--repeat", "1e3"),
    (REPLAY, "--fake-gpus", "1000"),
    (REPLAY, "--timeout", "nan"),
    (REPLAY, "--timeout", "-3"),
    (REPLAY, "--gpus", "0,70000"),
]


@pytest.mark.parametrize(("sub", "flag", "bad"), BAD_KREX)
def test_krex_flags_refuse_out_of_range_values(
    sub: list[str], flag: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*sub, flag, bad] + (["--", "true"] if sub == RUN else [])
    with pytest.raises(SystemExit) as info:
        krex_main.main(argv)
    assert info.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"argument {flag}:" in err.strip().splitlines()[-1], err


@pytest.mark.parametrize(
    ("flag", "bad"),
    [("--interval", "0"), ("--interval", "nan"), ("--interval", "inf"), ("--iterations", "-1")],
)
def test_krexctl_top_flags_refuse_out_of_range_values(
    flag: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        krexctl.main(["top", flag, bad])
    assert info.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: krexctl top") and f"argument {flag}:" in err.splitlines()[-1]


def test_in_range_values_pass_unchanged() -> None:
    args = krex_main.build_parser().parse_args(
        ["run", "--timeout", "1e6", "--gpu", "3", "--fault-retries", "0", "--", "true"]
    )
    assert (args.timeout, args.gpu, args.fault_retries) == (1e6, 3, 0)
    assert argtypes.seconds(0.1, 10, low_open=False)("0.1") == 0.1
    with pytest.raises(argparse.ArgumentTypeError, match=r"\[0\.1, 10\]"):
        argtypes.seconds(0.1, 10, low_open=False)("0.05")
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(0, 1000000\]"):
        argtypes.seconds()("1e7")
