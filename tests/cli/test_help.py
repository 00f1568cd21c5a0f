"""The commands' ``--help`` texts and usage errors, as a new user meets them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from krex_client.errors import ExitCode
from krexd.cli.krexd import build_parser as krexd_parser
from tests.support.krexd import KREX, KREXCTL

KREXD = [sys.executable, "-m", "krexd"]
HELPS = {
    "krex": [*KREX, "--help"],
    "krex run": [*KREX, "run", "--help"],
    "krex replay": [*KREX, "replay", "--help"],
    "krexctl": [*KREXCTL, "--help"],
    "krexctl status": [*KREXCTL, "status", "--help"],
    "krexd": [*KREXD, "--help"],
}


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("name", sorted(HELPS))
def test_help_is_plain_text(name: str) -> None:
    p = run(HELPS[name])
    assert p.returncode == 0, p.stderr
    assert "``" not in p.stdout, p.stdout  # reST markup rendered plainly
    assert p.stdout.startswith(f"usage: {name}")


def test_krexd_help_names_the_real_default_config() -> None:
    out = run(HELPS["krexd"]).stdout
    # krexd.config.config.default_path: $KREX_CONFIG, /etc/krex/krex.toml, the checkout's
    # etc/krex.toml.
    assert "$KREX_CONFIG" in out and "/etc/krex/krex.toml" in out
    assert "default: etc/krex.toml)" not in out


def test_krexd_foreground_is_the_default_and_still_accepted() -> None:
    out = run(HELPS["krexd"]).stdout
    options = out.split("options:", 1)[1]
    assert "--foreground" not in options  # not offered as if it changed anything
    assert "--foreground" not in out.splitlines()[0]
    args = krexd_parser().parse_args(["--foreground", "--fake-gpus", "1"])
    assert args.foreground and args.fake_gpus == 1


def test_krex_run_help_lists_its_exit_codes() -> None:
    out = run(HELPS["krex run"]).stdout
    codes = out.split("exit codes:", 1)[1]
    assert "CMD's own" in codes and "128+N" in codes
    for code in (
        ExitCode.TIMEOUT,
        ExitCode.UNAVAILABLE,
        ExitCode.TEMPFAIL,
        ExitCode.WRONG_GPU,
        ExitCode.CANNOT_EXEC,
        ExitCode.NOT_FOUND,
        ExitCode.DATAERR,
        ExitCode.NOPERM,
        ExitCode.SOFTWARE,
    ):
        assert any(line.split()[:1] == [str(int(code))] for line in codes.splitlines()), code


@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        ([*KREX, "run", "--gpu", "-1", "--", "true"], "usage: krex run", "--gpu"),
        ([*KREX, "run", "--gpu", "x", "--", "true"], "usage: krex run", "--gpu"),
        ([*KREX, "run", "--bogus", "--", "true"], "usage: krex run", "--bogus"),
        ([*KREX, "run", "--label", "", "--", "true"], "usage: krex run", "--label"),
        ([*KREX, "run", "--retry-tempfail", "-1", "--", "true"], "usage: krex run", "--retry"),
        ([*KREX, "run"], "usage: krex run", "needs a command"),
        ([*KREX, "replay", "t.jsonl", "--out", "o", "--bogus"], "usage: krex replay", "--bogus"),
        ([*KREXCTL, "status", "--bogus"], "usage: krexctl status", "--bogus"),
    ],
)
def test_subcommand_errors_show_the_subcommands_usage(
    argv: list[str], usage: str, error: str
) -> None:
    p = run(argv)
    assert p.returncode == ExitCode.USAGE
    assert p.stderr.startswith(usage), p.stderr
    assert error in p.stderr.splitlines()[-1]
