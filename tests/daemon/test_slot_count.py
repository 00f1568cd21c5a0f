"""``[admission] slots_per_gpu``: "auto" per GPU (krexd.config.slot_count), a fixed override."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from krex_cli.krexctl import render
from krexd.config.config import AdmissionConfig, Config, ConfigError, from_dict, parse_cores
from krexd.config.slot_count import AUTO_MAX, AUTO_MIN, choose
from tests.support.krexd import KREXCTL, Krexd

G = 1 << 30


def test_auto_is_the_default_and_config_takes_auto_or_an_integer() -> None:
    assert AdmissionConfig().slots_per_gpu == "auto" == Config().admission.slots_per_gpu
    assert from_dict({"admission": {"slots_per_gpu": "auto"}}).admission.slots_per_gpu == "auto"
    assert from_dict({"admission": {"slots_per_gpu": 12}}).admission.slots_per_gpu == 12


@pytest.mark.parametrize("bad", ["Auto", "4", "", 0, -1, 1025, 2.5, True, [4], {"a": 1}])
def test_garbage_is_refused_with_one_line(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict({"admission": {"slots_per_gpu": bad}})
    text = str(info.value)
    assert text.startswith("[admission] slots_per_gpu: must be") and "\n" not in text
    assert '"auto"' in text


@pytest.mark.parametrize(
    ("cores", "mem", "need", "headroom", "total", "rule"),
    [
        # The 16-core H200 host: 15 tenant cores, 140 GiB; the cores bound it.
        (15, 140 * G, G, G, 15, "auto: 15 = min(cores 15 x 1, memory 139.0 GiB / 1.0 GiB)"),
        # Large default needs: memory bounds it.
        (14, 140 * G, 16 * G, G, 8, "auto: 8 = min(cores 14 x 1, memory 139.0 GiB / 16.0 GiB)"),
        (32, 80 * G, 8 * G, 0, 10, None),
        # A 2-core CI machine: one tenant core, or none left: the old default, 4.
        (1, 80 * G, G, G, 4, "auto: 4 = min(cores 1 x 1 raised to 4, memory 79.0 GiB / 1.0 GiB)"),
        (0, 80 * G, G, G, 4, None),
        # ... unless memory holds fewer.
        (1, 3 * G, G, G, 2, None),
        # A card smaller than one command's default need still runs one.
        (8, 2 * G, 4 * G, G, 1, "auto: 1 = min(cores 8 x 1, memory 1.0 GiB / 4.0 GiB), at least 1"),
        # Huge slices: capped.
        (256, 1 << 50, G, G, AUTO_MAX, None),
        # Unknown memory or no default need: the cores alone.
        (6, 0, G, G, 6, "auto: 6 = min(cores 6 x 1)"),
        (6, 80 * G, 0, G, 6, None),
    ],
)
def test_auto_derivation(
    cores: int, mem: int, need: int, headroom: int, total: int, rule: str | None
) -> None:
    chosen = choose("auto", cores, mem, need, headroom)
    assert (chosen.total, chosen.mode) == (total, "auto")
    if rule is not None:
        assert chosen.rule == rule


def test_a_fixed_count_overrides_the_derivation() -> None:
    chosen = choose(4, 15, 140 * G, G, G)
    assert chosen.as_dict() == {
        "total": 4,
        "mode": "fixed",
        "rule": "fixed: 4 ([admission] slots_per_gpu = 4)",
    }
    assert choose(200, 1, G, G, 0).total == 200  # the operator's word, even past the cores


def test_capped_rule_says_so() -> None:
    assert "cores 256 x 1 capped at 64" in choose("auto", 256, 1 << 50, G, G).rule


def test_status_table_shows_each_gpus_rule() -> None:
    st = {
        "version": "v",
        "pid": 1,
        "uptime_s": 1.0,
        "state": "running",
        "socket": "/s",
        "gpus": [
            {
                "index": 0,
                "name": "fake GPU 0",
                "slots_used": 0,
                "slots_total": 15,
                "slots": {"total": 15, "mode": "auto", "rule": "auto: 15 = min(cores 15 x 1)"},
            }
        ],
    }
    assert "gpu0 slots auto: 15 = min(cores 15 x 1)" in render(st)


Factory = Callable[..., Krexd]


@pytest.mark.root
def test_krexd_derives_its_slots_and_status_says_how(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=2, config={"admission": {"slots_per_gpu": "auto"}})
    st = k.status()
    for g in st["gpus"]:
        cores = len(parse_cores(g["slice"]["tenant_cores"]))
        usable = (g["total_mem_bytes"] - G) // G  # shipped headroom and default need: 1 GiB
        expected = max(1, min(max(cores, AUTO_MIN), AUTO_MAX, usable))
        assert g["slots_total"] == expected
        assert g["slots"]["mode"] == "auto" and g["slots"]["total"] == expected
        assert g["slots"]["rule"].startswith(f"auto: {expected} = min(cores {cores} x 1")
    table = subprocess.run(
        [*KREXCTL, "status", "--socket", k.socket], capture_output=True, text=True, timeout=30
    )
    assert table.returncode == 0, table.stderr
    assert f"gpu1 slots {st['gpus'][1]['slots']['rule']}" in table.stdout
    j = subprocess.run(
        [*KREXCTL, "status", "--json", "--socket", k.socket], capture_output=True, text=True
    )
    assert json.loads(j.stdout)["gpus"][0]["slots"] == st["gpus"][0]["slots"]


@pytest.mark.root
def test_a_fixed_count_is_shown_as_fixed(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=1, slots=3)
    g = k.status()["gpus"][0]
    assert g["slots_total"] == 3 and g["slots"]["mode"] == "fixed"
