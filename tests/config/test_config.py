"""krexd.config.config: shipped file, unknown keys and bad values named in errors."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from krexd.config.config import Config, ConfigError, format_cores, load, parse_cores, with_overrides

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "etc" / "krex.toml"


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "k.toml"
    p.write_text(text)
    return str(p)


def test_shipped_config_is_the_defaults() -> None:
    cfg = load(str(SHIPPED))
    assert dataclasses.replace(cfg, source="") == Config()


def test_shipped_config_documents_every_key() -> None:
    text = SHIPPED.read_text()
    for table in dataclasses.fields(Config):
        if table.name == "source":
            continue
        assert f"[{table.name}]" in text
        sub = getattr(Config(), table.name)
        for f in dataclasses.fields(sub):
            if f.name == "slices":
                assert "[cpu.slices]" in text
                continue
            m = re.search(rf"^((?:#.*\n)+){f.name} = ", text, re.M)
            assert m, f"[{table.name}] {f.name} is not shipped with a comment above it"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[cgroup\] nmae: unknown key"):
        load(write(tmp_path, '[cgroup]\nnmae = "x"\n'))


def test_unknown_table_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[gpus\]: unknown table"):
        load(write(tmp_path, "[gpus]\nx = 1\n"))


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[admission]\nslots_per_gpu = 0\n", r"\[admission\] slots_per_gpu"),
        ('[admission]\nslots_per_gpu = "4"\n', r"\[admission\] slots_per_gpu"),
        ("[cpu]\nallow_shared = 1\n", r"\[cpu\] allow_shared"),
        ('[cgroup]\nbackend = "v3"\n', r"\[cgroup\] backend"),
        ('[cgroup]\nname = "cgroup.procs"\n', r"\[cgroup\] name"),
        ('[cgroup]\nname = "a/b"\n', r"\[cgroup\] name"),
        ("[cgroup]\npids_max = -1\n", r"\[cgroup\] pids_max"),
        ('[gpu]\ndevice_isolation = "on"\n', r"\[gpu\] device_isolation"),
        ("[gpu]\ndevice_isolation = true\n", r"\[gpu\] device_isolation"),
        ('[daemon]\nsocket_mode = "999"\n', r"\[daemon\] socket_mode"),
        ('[daemon]\nsocket = "/' + "x" * 120 + '"\n', r"\[daemon\] socket"),
        ("[region]\nmax_region_s = -1\n", r"\[region\] max_region_s"),
        ('[cpu.slices]\n0 = "3-1"\n', r"\[cpu\] slices"),
        ('[cpu.slices]\ngpu0 = "0"\n', r"\[cpu\] slices"),
        ('[shim]\npath = "relative.so"\n', r"\[shim\] path"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load(write(tmp_path, text))


def test_not_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(write(tmp_path, "[daemon\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(str(tmp_path / "absent.toml"))


def test_values_are_converted(tmp_path: Path) -> None:
    cfg = load(
        write(tmp_path, '[daemon]\nsocket_mode = "0640"\n[cpu.slices]\n0 = "0-2,5"\n1 = [7, 6]\n')
    )
    assert cfg.daemon.socket_mode == 0o640
    assert cfg.cpu.slices == {0: (0, 1, 2, 5), 1: (6, 7)}


def test_overrides() -> None:
    cfg = with_overrides(Config(), socket="rel.sock", fake_gpus=3)
    assert cfg.daemon.socket == os.path.abspath("rel.sock") and cfg.daemon.fake_gpus == 3
    with pytest.raises(ConfigError, match="command line"):
        with_overrides(Config(), fake_gpus=-1)


def test_core_lists() -> None:
    assert parse_cores("0-3, 8") == (0, 1, 2, 3, 8)
    assert format_cores((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    with pytest.raises(ValueError):
        parse_cores("a-b")


def test_max_region_s_zero_means_no_limit_and_negative_is_refused() -> None:
    from krexd.config.config import ConfigError, from_dict

    assert from_dict({"region": {"max_region_s": 0}}).region.max_region_s == 0.0
    with pytest.raises(ConfigError, match=r"\[region\] max_region_s: must be >= 0"):
        from_dict({"region": {"max_region_s": -1}})


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (bytes(range(256)) * 4, "not UTF-8"),
        (b'[daemon]\nsocket = "\xff\xfe"\n', "not UTF-8"),
        (b"[daemon\nsocket = ", "not valid TOML"),
        (b'[shim]\npath = "/nonexistent/libkrex_shim.so"\n', "no such file"),
    ],
)
def test_bad_configuration_gets_one_line_and_exit_78(tmp_path: Path, data: bytes, why: str) -> None:
    """Random bytes printed a Python traceback; a missing [shim] path was searched around."""
    path = tmp_path / "krex.toml"
    path.write_bytes(data)
    p = subprocess.run(
        [sys.executable, "-m", "krexd", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KREX_SOCKET": str(tmp_path / "s.sock")},
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 78, p.stderr
    assert len(lines) == 1 and str(path) in lines[0] and why in lines[0], p.stderr
