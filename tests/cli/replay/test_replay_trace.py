"""The trace parser, the mode table and the generated krexd config."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from krex_cli.replay import modes, trace
from krex_cli.replay.options import resolve_argv
from krex_cli.replay.results import parse_result

GOOD = {
    "argv": ["python", "w/gemm.py", "--task", "t"],
    "task": "t",
    "candidate": "c",
    "band": "0.1-1ms",
    "note": "kept",
}


def test_parse_good_lines_skips_blanks_and_keeps_extra() -> None:
    lines = ["", json.dumps(GOOD), "   ", json.dumps({**GOOD, "candidate": "d"})]
    es = trace.parse_lines(lines, "x.jsonl")
    assert [e.candidate for e in es] == ["c", "d"]
    assert es[0].argv == ("python", "w/gemm.py", "--task", "t")
    assert es[0].key == ("t", "c")
    assert es[0].extra == {"note": "kept"}


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{not json", "x.jsonl:2: not valid JSON"),
        (json.dumps([1, 2]), "expected a JSON object"),
        (json.dumps({**GOOD, "argv": []}), "'argv' must be"),
        (json.dumps({**GOOD, "argv": "python x.py"}), "'argv' must be"),
        (json.dumps({**GOOD, "argv": ["python", ""]}), "'argv' must be"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "task"}), "'task' must be"),
        (json.dumps({**GOOD, "candidate": 3}), "'candidate' must be"),
        (json.dumps({**GOOD, "band": "fast"}), "'band' is 'fast', expected one of"),
    ],
)
def test_bad_lines_name_file_and_line(line: str, fragment: str) -> None:
    with pytest.raises(trace.TraceError) as ei:
        trace.parse_lines([json.dumps(GOOD), line], "x.jsonl")
    assert fragment in str(ei.value)
    assert "x.jsonl:2" in str(ei.value)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(trace.TraceError, match="holds no command"):
        trace.load(tmp_path / "empty.jsonl")
    with pytest.raises(trace.TraceError, match="cannot read trace"):
        trace.load(tmp_path / "absent.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(trace.TraceError, match="not UTF-8"):
        trace.load(tmp_path / "bin.jsonl")


def test_dump_load_round_trip(tmp_path: Path) -> None:
    es = trace.parse_lines([json.dumps(GOOD)])
    trace.dump(es, tmp_path / "t.jsonl")
    back = trace.load(tmp_path / "t.jsonl")
    assert back == es and back[0].extra == {"note": "kept"}


def test_band_is_optional_and_stays_unknown(tmp_path: Path) -> None:
    no_band = {k: v for k, v in GOOD.items() if k != "band"}
    (e,) = trace.parse_lines([json.dumps(no_band)], "x.jsonl")
    assert e.band is None and e.extra == {"note": "kept"}
    trace.dump([e], tmp_path / "t.jsonl")
    assert "band" not in json.loads((tmp_path / "t.jsonl").read_text())
    assert trace.load(tmp_path / "t.jsonl") == [e]


def test_band_of() -> None:
    assert trace.band_of(0.01) == "<0.1ms"
    assert trace.band_of(0.1) == "0.1-1ms"
    assert trace.band_of(9.99) == "1-10ms"
    assert trace.band_of(25.0) == ">=10ms"
    with pytest.raises(ValueError):
        trace.band_of(float("nan"))


def test_modes() -> None:
    assert modes.make_mode("native", 1) == modes.Mode("native", 1, False, True)
    assert modes.make_mode("ungated", 8) == modes.Mode("ungated", 8, True, False)
    assert modes.make_mode("krex", 16).enforce
    for name, conc, msg in (
        ("fast", 1, "unknown mode"),
        ("krex", 0, ">= 1"),
        ("serial", 4, "one command per GPU"),
    ):
        with pytest.raises(modes.ModeError, match=msg):
            modes.make_mode(name, conc)


def test_generated_config_round_trips_and_overrides(tmp_path: Path) -> None:
    base_text = (
        'socket = "/run/krex/krexd.sock"\n'
        "[admission]\nslots_per_gpu = 16\nqueue = [1, 2]\n"
        "[region]\nenforce = true\nmax_region_s = 30.0\n"
        '[cgroup]\nname = "krex"\n[cpu]\nreserved_cores = 1\n[cpu.slices]\n0 = "0-15"\n'
    )
    base_path = tmp_path / "base.toml"
    base_path.write_text(base_text)
    out = modes.write_config(modes.make_mode("ungated", 4), tmp_path / "k.toml", base_path)
    got = tomllib.loads(out.read_text())
    want = tomllib.loads(base_text)
    table, key = modes.CONCURRENCY_KEY
    want.setdefault(table, {})[key] = 4
    want["region"]["enforce"] = False
    want["cgroup"]["name"] = f"krex-replay-{os.getpid()}"
    assert got == want
    # The base file is untouched.
    assert base_path.read_text() == base_text


def test_parse_result_and_argv() -> None:
    out = 'noise\n{"median_ms": 1.5, "task": "t"}\n{"other": 1}\nnot json {\n'
    assert parse_result(out) == {"median_ms": 1.5, "task": "t"}
    assert parse_result("nothing here\n") is None
    assert resolve_argv(["python3", "x.py"], "/opt/py") == ["/opt/py", "x.py"]
    assert resolve_argv(["/bin/true"], "/opt/py") == ["/bin/true"]


def test_toml_writer_quotes_keys_and_refuses_odd_values() -> None:
    cfg = {"top": True, "a": {"x.y": 1, "s": 'q"\\', "b": {"0": "0-3", "k k": [1.5, 2]}}}
    assert tomllib.loads(modes.dumps_toml(cfg)) == cfg
    with pytest.raises(modes.ModeError, match="cannot be written"):
        modes.dumps_toml({"a": {"b": None}})
    with pytest.raises(modes.ModeError, match="not finite"):
        modes.dumps_toml({"a": float("nan")})


def test_ping_names_a_socket_nothing_listens_on(tmp_path: Path) -> None:
    import socket as pysocket

    path = str(tmp_path / "dead.sock")
    s = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    s.bind(path)  # the socket file of a krexd that died: bound, never listening
    s.close()
    with pytest.raises(modes.ModeError, match="dead.sock"):
        modes.ping(path, timeout_s=0.5)
    with pytest.raises(modes.ModeError, match="no such socket"):
        modes.ping(str(tmp_path / "missing.sock"), timeout_s=0.5)


@pytest.mark.root
def test_ping_gets_krexd_s_reply(krexd_factory: Any) -> None:
    k = krexd_factory()
    body = modes.ping(k.socket, timeout_s=5.0)
    assert body["pid"] == k.pid and "version" in body
