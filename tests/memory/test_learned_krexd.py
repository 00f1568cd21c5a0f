"""Learned memory needs with krexd over the fake driver (1 GiB simulated GPU).

* a command's peak becomes the need of the next command with its label,
  shown by ``krexctl status``, and survives a restart of krexd;
* ``krex run --retry-tempfail N`` runs a command failed by co-tenants
  (exit 75) again, and says so;
* commands whose peaks are 70% of the card, started 8 at once without
  ``--mem``: once each label has run once, none fails because of a
  co-tenant; with learning off the same start loses commands to co-tenants
  (exit 75), so the check can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for
from tests.support.krexd import Krexd

from .conftest import ALLOCATOR, Proc
from .test_krexd_memory import Stack

pytestmark = [pytest.mark.root]

M = 1 << 20
PEAK = "717M"  # 70% of the 1 GiB card


class LabelledStack(Stack):
    def run_as(self, label: str, *steps: str, opts: tuple[str, ...] = ()) -> Proc:
        """``krex run --label LABEL [OPTS] -- allocator.py STEPS`` in the background."""
        return Proc(
            subprocess.Popen(
                [*self.k.krex, "run", "--label", label, *opts, "--"]
                + [sys.executable, str(ALLOCATOR), *steps],
                env=self.env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )


@pytest.fixture
def lstack(
    krexd_factory: Callable[..., Krexd], built: None, tmp_path: Path
) -> Callable[..., LabelledStack]:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    name = f"krexlearn{os.getpid()}{tmp_path.name[-8:].replace('-', '')}"

    def start(slots: int = 4, **memory: Any) -> LabelledStack:
        fake = tmp_path / "fakestate"
        k = krexd_factory(
            slots=slots,
            name=name,
            config={
                "daemon": {"state_dir": str(state_dir)},
                "memory": {"refresh_ms": 20, "headroom": "0", **memory},
            },
            env={"KREX_FAKE_STATE": str(fake), "KREX_FAKE_MEM_BYTES": "1G"},
        )
        return LabelledStack(k, fake)

    return start


def _tenant(s: Stack) -> dict[str, Any]:
    (t,) = s.tenants()
    return dict(t["memory"])


def test_a_peak_becomes_the_next_need_and_survives_a_restart(
    lstack: Callable[..., LabelledStack],
) -> None:
    s = lstack(default_need="100M")
    first = s.run_as("big", "alloc=600M", "hold=0.3", "free")
    assert first.finish(30)[0] == 0
    second = s.run_as("big", "alloc=10M", "wait")
    assert second.next(20)["op"] == "start"
    mem = _tenant(s)
    assert (mem["label"], mem["need_source"]) == ("big", "learned")
    assert mem["learned_bytes"] == mem["need_bytes"] == 600 * M
    assert mem["declared_bytes"] is None
    text = subprocess.run(
        [*s.k.krexctl, "status"], env=s.k.env, capture_output=True, text=True, check=True
    ).stdout
    assert "learned 600 MiB, declared -" in text
    second.go()
    assert second.finish()[0] == 0
    other = s.run_as("small", "alloc=10M", "wait")
    assert other.next(20)["op"] == "start"
    assert _tenant(s)["need_source"] == "default"
    other.go()
    assert other.finish()[0] == 0
    s.k.stop()
    again = lstack(default_need="100M")  # same state directory and name: a restart
    third = again.run_as("big", "wait")
    assert third.next(20)["op"] == "start"
    assert (_tenant(again)["need_source"], _tenant(again)["need_bytes"]) == ("learned", 600 * M)
    third.go()
    assert third.finish()[0] == 0


def _eight_at_once(s: LabelledStack) -> list[int]:
    procs = [s.run_as(f"p70-{i % 2}", f"alloc={PEAK}", "hold=0.8", "free") for i in range(8)]
    return [p.finish(120)[0] for p in procs]


def test_eight_commands_at_70_percent_no_cotenant_failure_once_learned(
    lstack: Callable[..., LabelledStack],
) -> None:
    s = lstack(slots=8, oom_wait_s=1)
    for label in ("p70-0", "p70-1"):  # each label runs once, alone
        assert s.run_as(label, f"alloc={PEAK}", "hold=0.2", "free").finish(30)[0] == 0
    codes = _eight_at_once(s)
    assert codes == [0] * 8, f"exit codes {codes}: 75 = failed by co-tenants"
    wait_for(lambda: not s.tenants(), 10, "all tenants end")


def test_eight_commands_at_70_percent_fail_without_learning(
    lstack: Callable[..., LabelledStack],
) -> None:
    s = lstack(slots=8, oom_wait_s=1, learn=False)
    for label in ("p70-0", "p70-1"):
        assert s.run_as(label, f"alloc={PEAK}", "hold=0.2", "free").finish(30)[0] == 0
    codes = _eight_at_once(s)
    assert 75 in codes and set(codes) <= {0, 75}, codes


def test_retry_tempfail_runs_the_command_again(lstack: Callable[..., LabelledStack]) -> None:
    s = lstack(oom_wait_s=1, admission=False, retry_tempfail=0)
    hog = s.run_as("hog", "alloc=700M", "hold=2.5", "free")
    assert hog.next(20)["op"] == "start" and hog.next()["rc"] == "CUDA_SUCCESS"
    victim = s.run_as("victim", "alloc=500M", opts=("--retry-tempfail", "3"))
    code, err = victim.finish(60)
    assert code == 0, err
    starts = [x for x in victim.drain() if x["op"] == "start"]
    assert len(starts) >= 2, "the first run failed (exit 75) and ran again"
    assert "retry 1 of 3 after exit 75" in err and "caused by co-tenants" in err
    assert hog.finish(30)[0] == 0
    assert s.k.status()["memory"]["retry_tempfail"] == 0  # the flag overrode the default


def test_krexds_naming_one_learned_file_learn_from_each_other(
    krexd_factory: Callable[..., Krexd], built: None, tmp_path: Path
) -> None:
    """``[memory] learned_file``: a krexd of another cgroup name (a second replay) starts
    with the needs the first one learned; without it, it would start from nothing."""
    learned = tmp_path / "learned" / "needs.json"
    fake = tmp_path / "fakestate"

    def start(name: str) -> LabelledStack:
        k = krexd_factory(
            name=name,
            config={
                "memory": {
                    "refresh_ms": 20,
                    "headroom": "0",
                    "default_need": "100M",
                    "learned_file": str(learned),
                },
            },
            env={"KREX_FAKE_STATE": str(fake), "KREX_FAKE_MEM_BYTES": "1G"},
        )
        return LabelledStack(k, fake)

    suffix = tmp_path.name[-6:].replace("-", "")
    first = start(f"krexlfa{suffix}")
    assert first.run_as("big", "alloc=600M", "hold=0.3", "free").finish(30)[0] == 0
    first.k.stop()
    assert learned.exists()
    second = start(f"krexlfb{suffix}")
    p = second.run_as("big", "wait")
    assert p.next(20)["op"] == "start"
    assert (_tenant(second)["need_source"], _tenant(second)["need_bytes"]) == ("learned", 600 * M)
    p.go()
    assert p.finish()[0] == 0
