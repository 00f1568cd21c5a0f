"""The start flags ``krex replay --warm`` gives each ``krex run``, locally and over Ray.

No krexd and no Ray: the argv the local runner builds is caught at its
spawn, the :class:`krex_client.cluster.Command` the Ray runner builds at its
submission.  That the flags then do what they say is tested end to end in
test_replay_e2e.py (root) and, for the cluster task, in tests/client/test_cluster.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from krex_cli.replay import cli, trace
from krex_cli.replay.options import RunOptions
from krex_cli.replay.ray_runner import RayRunner
from krex_cli.replay.runner import Runner
from krex_client import cluster

START_FLAGS = ("--warm", "--cold", "-v")


def _options(tmp_path: Path, *args: str) -> RunOptions:
    """``krex replay`` options of a one-command trace, mode krex, from command-line ``args``."""
    tr = tmp_path / "trace.jsonl"
    trace.dump([trace.TraceEntry(("python", "-c", "pass"), "t", "c", "<0.1ms")], tr)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ns = cli.build_parser().parse_args([str(tr), "--mode", "krex", "--out", str(out), *args])
    opts = cli._options(ns)
    assert isinstance(opts, RunOptions)
    return opts


def _local_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pass_: int, index: int, *args: str
) -> list[str]:
    """The start flags of ``krex run`` for the command at (``pass_``, ``index``)."""
    opts = _options(tmp_path, "--socket", "/none", "--gpus", "0", "--concurrency", "1", *args)
    seen: list[list[str]] = []

    def spawn(self: Runner, argv: list[str], env: dict[str, str]) -> Any:
        seen.append(argv)
        raise OSError("stand-in: not started")

    monkeypatch.setattr(Runner, "_spawn", spawn)
    rec = Runner(opts)._attempt(0, 0, "/none", pass_, index, opts.trace[0])
    assert rec["error"] == "cannot start: stand-in: not started"
    (argv,) = seen
    assert argv[argv.index("--") + 1 :][1:] == ["-c", "pass"]
    run = argv[argv.index("run") + 1 : argv.index("--")]
    return [a for a in run if a in START_FLAGS]


def test_by_default_krexd_decides_how_replayed_commands_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --warm: no start flag, so krexd's ``[warm] start`` decides as for ``krex run``;
    ``-v`` so the record says how it started."""
    assert _options(tmp_path, "--socket", "/none", "--gpus", "0").warm == "auto"
    assert _local_flags(tmp_path, monkeypatch, 0, 0) == ["-v"]
    assert _local_flags(tmp_path, monkeypatch, 0, 0, "--warm", "auto") == ["-v"]


@pytest.mark.parametrize(
    "choice, at, flags",
    [
        ("off", (0, 1), ["--cold"]),
        ("on", (0, 0), ["--warm", "-v"]),
        ("alternate", (0, 0), ["--cold"]),
        ("alternate", (0, 1), ["--warm", "-v"]),
        ("alternate", (1, 0), ["--warm", "-v"]),
    ],
)
def test_asked_starts_pass_their_flag(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    choice: str,
    at: tuple[int, int],
    flags: list[str],
) -> None:
    assert _local_flags(tmp_path, monkeypatch, *at, "--warm", choice) == flags


def test_native_modes_take_no_start_but_accept_the_neutral_choices(tmp_path: Path) -> None:
    tr = tmp_path / "trace.jsonl"
    trace.dump([trace.TraceEntry(("true",), "t", "c", "<0.1ms")], tr)
    for choice, ok in (("auto", True), ("off", True), ("on", False), ("alternate", False)):
        ns = cli.build_parser().parse_args(
            [str(tr), "--mode", "native", "--gpus", "0", "--out", str(tmp_path), "--warm", choice]
        )
        assert isinstance(cli._options(ns), RunOptions) == ok, choice


def _ray_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pass_: int, index: int, *args: str
) -> str | None:
    """The start preference of the cluster command the Ray runner submits at (pass, index)."""
    opts = _options(tmp_path, "--ray", "head:6379", *args)
    seen: list[cluster.Command] = []

    def run_remote(self: RayRunner, command: cluster.Command, limit_s: float) -> Any:
        seen.append(command)
        return None, "stand-in: no cluster"

    monkeypatch.setattr(RayRunner, "_run_remote", run_remote)
    rec = RayRunner(opts)._attempt(0, -1, None, pass_, index, opts.trace[0])
    assert rec["error"] == "stand-in: no cluster"
    (command,) = seen
    return command.start


def test_the_ray_runner_passes_the_start_preference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _ray_start(tmp_path, monkeypatch, 0, 0) is None  # krexd's default on each host
    assert _ray_start(tmp_path, monkeypatch, 0, 0, "--warm", "off") == "cold"
    assert _ray_start(tmp_path, monkeypatch, 0, 0, "--warm", "on") == "warm"
    alternate = [
        _ray_start(tmp_path, monkeypatch, p, i, "--warm", "alternate") for p, i in ((0, 0), (0, 1))
    ]
    assert alternate == ["cold", "warm"]


def test_krex_mode_defaults_to_the_started_krexds_slots_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "krex.toml"
    config.write_text("[admission]\nslots_per_gpu = 3\n", encoding="utf-8")
    assert _options(tmp_path, "--fake-gpus", "1", "--config", str(config)).mode.concurrency == 3
    err = capsys.readouterr().err
    assert (
        f"--concurrency 3: the slots per GPU its krexd gets ([admission] slots_per_gpu of {config})"
        in err
    )
    assert not _options(tmp_path, "--fake-gpus", "1", "--config", str(config)).slots_from_krexd
    capsys.readouterr()
    # "auto" (krexd's default, so also a config without the key): the started krexd decides;
    # the replay asks its status once it is up (test_replay_e2e.py runs it)
    for text in ("[region]\nenforce = true\n", '[admission]\nslots_per_gpu = "auto"\n'):
        config.write_text(text, encoding="utf-8")
        assert _options(tmp_path, "--fake-gpus", "1", "--config", str(config)).slots_from_krexd
        assert capsys.readouterr().err == ""  # said once krexd answered
    assert _options(tmp_path, "--fake-gpus", "1", "--concurrency", "2").mode.concurrency == 2
    assert capsys.readouterr().err == ""  # asked for: nothing to say


def test_krex_mode_defaults_to_a_running_krexds_reported_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from krex_cli.replay import daemon_info

    gpus = [{"index": 0, "slots_total": 6}, {"index": 1, "slots_total": 5}]
    monkeypatch.setattr(daemon_info, "daemon_status", lambda socket: {"gpus": gpus})
    assert _options(tmp_path, "--socket", "/s").mode.concurrency == 5  # the fewest of the GPUs
    assert "--concurrency 5: the slots per GPU the krexd at /s reports" in capsys.readouterr().err
    assert _options(tmp_path, "--socket", "/s", "--gpus", "0").mode.concurrency == 6
    monkeypatch.setattr(daemon_info, "daemon_status", lambda socket: None)
    assert _options(tmp_path, "--socket", "/s", "--gpus", "0").mode.concurrency == 1
    assert "the krexd at /s did not report its slots" in capsys.readouterr().err
