"""GPU-wide faults under MPS, over the fake driver's MPS model (KREX_FAKE_MPS).

Real krexd with ``[mps] enabled`` and the stand-in control program, real
``krex run``, the real shim, fakebench tenants: one of them launches a
faulting kernel.  Under MPS every co-tenant then fails with the same error
(the fake server spreads it); krexd must detect it, pause the GPU, tell the
culprit from its casualties, and ``krex run`` must re-run the casualties so
that they end with exit 0.  Without MPS only the faulty command fails.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

import pytest

from krex_cli import casualty
from tests.support import FAKE_DIR
from tests.support.krexd import Krexd

from .test_mps import FAKE

pytestmark = [pytest.mark.root]

MPS = f'[mps]\nenabled = true\ncontrol = "{FAKE}"\n'


def _env(k: Krexd, tmp: Any, mps: str | None) -> dict[str, str]:
    env = dict(k.env)
    env.update(
        LD_LIBRARY_PATH=str(FAKE_DIR),
        KREX_FAKE_STATE=os.path.join(str(tmp), "fake.state"),
        KREX_FAKE_GPUS="1",
    )
    if mps is not None:
        env["KREX_FAKE_MPS"] = mps
    return env


def _krex_run(k: Krexd, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    bench = str(FAKE_DIR / "bin" / "fakebench")
    return subprocess.Popen(
        [*k.krex, "run", "--", bench, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _scenario(k: Krexd, env: dict[str, str], healthy_s: str) -> tuple[Any, list[Any]]:
    """Three healthy tenants, then one whose kernel faults; (faulty, healthy) results."""
    healthy = [_krex_run(k, env, "--seconds", healthy_s, "--kernel-ns", "100000") for _ in range(3)]
    time.sleep(0.8)  # all three admitted and launching
    faulty = _krex_run(k, env, "--count", "100000", "--fault-after", "5", "--kernel-ns", "100000")
    results = [p.communicate(timeout=120) + (p.returncode,) for p in [faulty, *healthy]]
    return results[0], results[1:]


def _member_then_fault(
    k: Krexd, env: dict[str, str], then: str
) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """A command admitted now that runs the shell line ``then`` 1.5 s later, and a faulty
    one started once the first is a member of the incident to come: (member, faulty)."""
    member = subprocess.Popen(
        [*k.krex, "run", "--", "sh", "-c", f"sleep 1.5; {then}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)  # admitted: a member of the incident to come
    return member, _krex_run(k, env, "--count", "1000", "--fault-after", "2")


def _starts(k: Krexd) -> int:
    with open(os.path.join(k.workdir, "mps-gpu0", "log", "starts")) as f:
        return len(f.read().splitlines())


@pytest.mark.usefixtures("built")
def test_the_server_log_detects_a_fault_but_its_named_client_is_not_blamed(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """The real server names *a* client in its fatal line, not the culprit (seen on the H200).

    The fake server's line names the culprit itself here; krexd must still not
    take it for attribution: every member that launched kernels is a suspect,
    re-run alone, and only the faulty command fails again.
    """
    k = krexd_factory(fake_gpus=1, slots=6, extra=MPS)
    (f_out, f_err, f_rc), healthy = _scenario(k, _env(k, tmp_path, "log"), "1.5")
    assert f_rc == 1, f_err
    assert "running it without MPS" in f_err
    for out, err, rc in healthy:
        assert rc == 0, f"a suspect's re-run failed:\n{err}"
        assert '"error": null' in out  # the re-run's own summary
    assert casualty.summary(f_err, f_rc) == {"role": "culprit", "reruns": 1}
    faults = k.status()["faults"]
    assert faults["totals"]["incidents"] == 1 and faults["totals"]["culprits"] == 0
    assert faults["incidents"] == [], "the incident was not closed"
    assert _starts(k) == 2, "the MPS control daemon was not restarted"
    with open(os.path.join(k.workdir, "mps-gpu0", "log", "server.log")) as f:
        assert "encountered a fatal GPU error." in f.read()  # detected from this line too


@pytest.mark.usefixtures("built")
def test_uncertain_attribution_reruns_suspects_without_mps(
    krexd_factory: Any, tmp_path: Any
) -> None:
    k = krexd_factory(fake_gpus=1, slots=6, extra=MPS)
    (f_out, f_err, f_rc), healthy = _scenario(k, _env(k, tmp_path, "1"), "1.0")
    # The re-run alone faults again: the culprit ends with its own error.
    assert f_rc == 1, f_err
    assert "running it without MPS" in f_err
    assert '"name": "CUDA_ERROR_ILLEGAL_ADDRESS"' in f_out
    for _out, err, rc in healthy:
        assert rc == 0, f"a suspect's re-run failed:\n{err}"
        assert "running it without MPS (re-run 1 of 2)" in err
    assert k.status()["faults"]["totals"]["suspects"] == 4
    assert casualty.summary(f_err, f_rc) == {"role": "culprit", "reruns": 1}
    assert {str(casualty.summary(err, rc)) for _o, err, rc in healthy} == {
        str({"role": "casualty", "reruns": 1})
    }


@pytest.mark.usefixtures("built")
def test_the_gpu_admits_nothing_until_every_client_is_gone_and_mps_restarted(
    krexd_factory: Any, tmp_path: Any
) -> None:
    k = krexd_factory(fake_gpus=1, slots=6, extra=MPS)
    env = _env(k, tmp_path, "log")
    sleeper = subprocess.Popen([*k.krex, "run", "--", "sleep", "3"], env=env)
    time.sleep(0.5)
    faulty = _krex_run(k, env, "--count", "1000", "--fault-after", "2")
    deadline = time.monotonic() + 60
    while not k.status()["faults"]["incidents"]:  # the fault, seen while the sleeper lives
        assert time.monotonic() < deadline, "no incident opened"
        time.sleep(0.05)
    assert k.status()["queue"]["paused_gpus"] == [0]
    later = _krex_run(k, env, "--count", "3")
    time.sleep(0.5)
    assert later.poll() is None, "admitted while the GPU's MPS server was faulted"
    assert k.status()["queue"]["parked"] >= 1
    assert sleeper.wait(timeout=60) == 0  # a member that saw no error: its own exit code
    assert faulty.wait(timeout=60) == 1  # a suspect re-run alone: it faults again
    out, err = later.communicate(timeout=60)
    assert later.returncode == 0, err
    assert _starts(k) == 2
    assert k.status()["queue"]["paused_gpus"] == []


@pytest.mark.usefixtures("built")
def test_without_mps_only_the_faulty_command_fails(krexd_factory: Any, tmp_path: Any) -> None:
    k = krexd_factory(fake_gpus=1, slots=6)
    (f_out, f_err, f_rc), healthy = _scenario(k, _env(k, tmp_path, None), "1.0")
    assert f_rc == 1
    assert '"name": "CUDA_ERROR_ILLEGAL_ADDRESS"' in f_out
    assert "faulted" not in f_err and "running it" not in f_err
    assert casualty.summary(f_err, f_rc) is None
    for _out, err, rc in healthy:
        assert rc == 0, err
        assert "running it" not in err, "a healthy command was run twice"
    assert k.status()["faults"] is None


@pytest.mark.usefixtures("built")
def test_suspects_rerun_beside_other_commands_and_outside_the_incident(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """A suspect's re-run is a shared tenant without MPS: it does not wait for the GPU to
    empty (an exclusive lease would wait for the long command admitted before it), and a
    fault of its own would not be the MPS server's (it is no incident member)."""
    k = krexd_factory(fake_gpus=1, slots=6, extra=MPS)
    env = _env(k, tmp_path, "1")
    # Long enough to be running when the fault comes, on a busy host too (one that ended
    # first is no member, so no suspect: 3 of 4 were seen so).
    healthy = [_krex_run(k, env, "--seconds", "4.0", "--kernel-ns", "100000") for _ in range(3)]
    time.sleep(0.8)
    faulty = _krex_run(k, env, "--count", "100000", "--fault-after", "5", "--kernel-ns", "100000")
    deadline = time.monotonic() + 60
    while not k.status()["faults"]["incidents"]:
        assert time.monotonic() < deadline, "no incident opened"
        time.sleep(0.02)
    # Parked while the GPU is paused, so admitted before any re-run asks for a slot.
    long = subprocess.Popen([*k.krex, "run", "--", "sleep", "15"], env=env)
    results = [p.communicate(timeout=60) + (p.returncode,) for p in [faulty, *healthy]]
    assert long.poll() is None, "the re-runs waited for the long command to end"
    f_out, f_err, f_rc = results[0]
    assert f_rc == 1 and "running it without MPS" in f_err, f_err
    for _out, err, rc in results[1:]:
        assert rc == 0, err
    faults = k.status()["faults"]
    assert faults["totals"]["incidents"] == 1, "the re-run's own fault opened an incident"
    assert faults["totals"]["suspects"] == 4
    long.terminate()
    long.wait(timeout=30)


@pytest.mark.usefixtures("built")
def test_a_member_refused_at_its_first_context_is_a_casualty_and_runs_again(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """Seen on the H200: a command admitted just before a fault made its first context
    while the server handled it, was refused (CUDA_ERROR_DEVICE_UNAVAILABLE), and ended 1
    with no verdict.  It launched nothing: a casualty, run again once the server is back."""
    k = krexd_factory(fake_gpus=1, slots=6, extra=MPS)
    bench = str(FAKE_DIR / "bin" / "fakebench")
    late, faulty = _member_then_fault(k, _env(k, tmp_path, "1"), f"exec {bench} --count 3")
    out, err = late.communicate(timeout=90)
    assert late.returncode == 0, err
    assert casualty.summary(err, late.returncode) == {"role": "casualty", "reruns": 1}, err
    assert faulty.wait(timeout=60) == 1
    assert k.status()["faults"]["totals"]["casualties"] == 1


@pytest.mark.usefixtures("built")
def test_a_member_that_fails_with_no_record_runs_again_without_mps_and_keeps_its_code(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """A member that fails during the incident leaves no record when its error is one the
    shim does not know (or its own): uncertain, so it runs once more without MPS, and a
    failure of its own then stands."""
    k = krexd_factory(fake_gpus=1, slots=6, extra=MPS)
    own, faulty = _member_then_fault(k, _env(k, tmp_path, "1"), "exit 3")
    _out, err = own.communicate(timeout=90)
    assert own.returncode == 3, err
    assert "an unrecorded error" in err and "running it without MPS (re-run 1 of 2)" in err, err
    assert err.count("running it") == 1, err
    assert faulty.wait(timeout=60) == 1
