"""``krex run`` end to end: real krexd, real cgroups, real child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import gone, wait_for
from tests.support.krexd import KREX, Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]
PY = sys.executable


def krex_run(k: Krexd, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    p: subprocess.CompletedProcess[str] = subprocess.run(
        [*k.krex, "run", *argv],
        env=kw.pop("env", k.env),
        capture_output=True,
        text=True,
        timeout=60,
        **kw,  # type: ignore[call-overload]
    )
    return p


def parked_is(k: Krexd, n: int) -> Callable[[], bool]:
    return lambda: bool(k.status()["queue"]["parked"] == n)


def test_exit_code_is_relayed(krexd_factory: Factory) -> None:
    k = krexd_factory()
    assert krex_run(k, "--", "sh", "-c", "exit 7").returncode == 7
    assert krex_run(k, "--", "true").returncode == 0
    assert krex_run(k, "sh", "-c", "exit 3").returncode == 3  # "--" is optional


def test_death_by_signal_is_128_plus_n(krexd_factory: Factory) -> None:
    k = krexd_factory()
    assert krex_run(k, "--", "sh", "-c", "kill -9 $$").returncode == 137
    assert krex_run(k, "--", "sh", "-c", "kill -TERM $$").returncode == 143


def test_command_not_found(krexd_factory: Factory) -> None:
    k = krexd_factory()
    p = krex_run(k, "--", "no-such-command-krex")
    assert p.returncode == 127 and "command not found" in p.stderr
    assert k.status()["tenants"] == []


def test_commands_that_cannot_run_say_why_as_a_shell_does(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory()
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF\x00not really")
    garbage.chmod(0o755)
    for argv, code, why in [
        (str(tmp_path), 126, "Is a directory"),
        (str(plain), 126, "Permission denied"),
        (str(tmp_path / "absent"), 127, "No such file or directory"),
        (str(garbage), 126, "Exec format error"),
    ]:
        p = krex_run(k, "--", argv)
        assert p.returncode == code, (argv, p.stderr)
        assert p.stderr.strip() == f"krex: {argv}: {why}", p.stderr
    wait_for(lambda: k.status()["tenants"] == [], 10)


def test_command_runs_in_its_tenant_cgroup_from_its_first_instruction(
    krexd_factory: Factory,
) -> None:
    k = krexd_factory()
    # cat is exec'd directly: the file it reads is the cgroup of its own first instruction.
    p = krex_run(k, "--", "cat", "/proc/self/cgroup")
    assert p.returncode == 0
    v2 = [line for line in p.stdout.splitlines() if line.startswith("0::")][0]
    assert v2.endswith(f"/{k.cgroup_name}/gpu0/t1"), p.stdout
    if k.status()["cgroups"]["cpuset"] == "v1":
        cpuset = [line for line in p.stdout.splitlines() if ":cpuset:" in line][0]
        assert cpuset.endswith(f"/{k.cgroup_name}/gpu0/t1")


def test_command_is_confined_to_its_slice(krexd_factory: Factory) -> None:
    k = krexd_factory(fake_gpus=2)
    st = k.status()
    p = krex_run(k, "--gpu", "1", "--", "grep", "Cpus_allowed_list", "/proc/self/status")
    assert p.stdout.split()[1] == st["gpus"][1]["slice"]["tenant_cores"]


def test_environment(krexd_factory: Factory) -> None:
    libm = "/lib/x86_64-linux-gnu/libm.so.6"
    if not os.path.exists(libm):
        pytest.skip("no libm to stand in for the shim")
    k = krexd_factory(fake_gpus=2, env={"KREX_SHIM": libm})
    env = dict(k.env, NOTIFY_SOCKET="/x", WATCHDOG_USEC="1", WATCHDOG_PID="1", LD_PRELOAD=libm)
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    p = krex_run(k, "--gpu", "1", "--", PY, "-c", dump, env=env)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["KREX_SOCKET"] == k.socket and got["KREX_GPU"] == "1"
    # Bound by UUID (the fake driver's for GPU 1), in PCI bus order.
    uuid = "GPU-6b726578-2d66-616b-652d-677000000001"
    assert got["CUDA_VISIBLE_DEVICES"] == uuid and got["KREX_GPU_UUID"] == uuid
    assert got["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and got["NCCL_NVLS_ENABLE"] == "0"
    assert int(got["KREX_TENANT"]) > 0 and len(got["KREX_TOKEN"]) == 32
    assert got["LD_PRELOAD"] == f"{libm}:{libm}"  # shim prepended to the caller's value
    for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert var not in got
    # --exclusive runs unshimmed.
    p = krex_run(k, "--exclusive", "--", PY, "-c", dump)
    got = json.loads(p.stdout)
    assert "LD_PRELOAD" not in got and "KREX_GATE" not in got and "KREX_TENANT" in got


def test_stdio_is_the_commands_own(krexd_factory: Factory) -> None:
    k = krexd_factory()
    p = krex_run(k, "--", "sh", "-c", "cat; echo err >&2", input="hello\n")
    assert p.stdout == "hello\n" and p.stderr == "err\n"


def test_timeout_kills_the_whole_tree(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory()
    pidfile = tmp_path / "pid"
    script = f"setsid sleep 31 & echo $! > {pidfile}; sleep 30"
    t0 = time.monotonic()
    p = krex_run(k, "--timeout", "1", "--", "sh", "-c", script)
    assert p.returncode == 124
    assert time.monotonic() - t0 < 10
    assert len(p.stderr.strip().splitlines()) == 1 and "timeout" in p.stderr
    escaped = int(pidfile.read_text())
    wait_for(lambda: gone(escaped), 5)
    assert k.status()["tenants"] == []


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 3), (signal.SIGINT, 4)])
def test_signals_are_forwarded(krexd_factory: Factory, tmp_path: Path, sig: int, code: int) -> None:
    k = krexd_factory()
    ready = tmp_path / "ready"
    prog = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
        f"signal.signal(signal.SIGINT, lambda *a: sys.exit(4))\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "time.sleep(60)\n"
    )
    run = subprocess.Popen([*k.krex, "run", "--", PY, "-c", prog], env=k.env)
    wait_for(ready.exists)
    run.send_signal(sig)
    assert run.wait(20) == code


def test_unreachable_krexd_is_exit_69() -> None:
    sock = "/nonexistent-krex/krexd.sock"
    env = dict(os.environ, KREX_SOCKET=sock)
    p = subprocess.run(
        [*KREX, "run", "--", "true"], env=env, capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 69
    assert len(p.stderr.strip().splitlines()) == 1 and sock in p.stderr


def test_parked_commands_run_in_fifo_order(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory(slots=1)
    order = tmp_path / "order"
    go = tmp_path / "go"
    first = subprocess.Popen(
        [
            *k.krex,
            "run",
            "--",
            "sh",
            "-c",
            f"echo A >> {order}; while [ ! -e {go} ]; do sleep 0.02; done",
        ],
        env=k.env,
    )
    wait_for(order.exists)
    later = []
    for name in "BCD":
        later.append(
            subprocess.Popen(
                [*k.krex, "run", "--", "sh", "-c", f"echo {name} >> {order}"], env=k.env
            )
        )
        wait_for(parked_is(k, len(later)))
    assert [w["command"][-1] for w in k.status()["queue"]["queue"]] == [
        f"echo {n} >> {order}" for n in "BCD"
    ]
    go.write_text("")
    assert first.wait(20) == 0 and all(p.wait(20) == 0 for p in later)
    assert order.read_text().split() == ["A", "B", "C", "D"]


def test_a_parked_command_says_where_it_waits(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory(slots=1)
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [*k.krex, "run", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"],
        env=k.env,
    )
    wait_for(lambda: len(k.status()["tenants"]) == 1)
    err = tmp_path / "err"
    with err.open("w") as stderr:  # not a terminal: -v asks for the line
        parked = subprocess.Popen(
            [*k.krex, "run", "-v", "--cold", "--", "true"], env=k.env, stderr=stderr
        )
        wait_for(parked_is(k, 1))
        wait_for(lambda: "queued:" in err.read_text(), 10)
        go.write_text("")
        assert holder.wait(20) == 0 and parked.wait(20) == 0
    lines = [line for line in err.read_text().splitlines() if "queued" in line]
    assert lines == [
        "krex: queued: 1 of 1 parked request; waiting for a free slot on any GPU (1 of 1 in use)"
    ]


def test_killed_launcher_frees_its_slot_and_its_command(krexd_factory: Factory) -> None:
    k = krexd_factory(slots=1)
    run = subprocess.Popen([*k.krex, "run", "--", "sleep", "60"], env=k.env)
    wait_for(lambda: bool(k.status()["tenants"]) and k.status()["tenants"][0]["pid"] is not None)
    cmd_pid = k.status()["tenants"][0]["pid"]
    run.kill()
    run.wait()
    wait_for(lambda: k.status()["tenants"] == [], 10)
    wait_for(lambda: gone(cmd_pid), 5)
    assert krex_run(k, "--", "true").returncode == 0


def test_killed_parked_launcher_leaves_the_queue(krexd_factory: Factory) -> None:
    k = krexd_factory(slots=1)
    holder = subprocess.Popen([*k.krex, "run", "--", "sleep", "60"], env=k.env)
    wait_for(lambda: len(k.status()["tenants"]) == 1)
    parked = subprocess.Popen([*k.krex, "run", "--", "true"], env=k.env)
    wait_for(lambda: k.status()["queue"]["parked"] == 1)
    parked.kill()
    parked.wait()
    wait_for(lambda: k.status()["queue"]["parked"] == 0, 10)
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(20) == 143
    wait_for(lambda: k.status()["gpus"][0]["slots_used"] == 0, 10)


def test_exclusive_waits_for_an_empty_gpu_and_holds_it(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory(slots=2)
    go = tmp_path / "go"
    shared = subprocess.Popen(
        [*k.krex, "run", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"], env=k.env
    )
    wait_for(lambda: len(k.status()["tenants"]) == 1)
    excl_go = tmp_path / "excl_go"
    excl = subprocess.Popen(
        [
            *k.krex,
            "run",
            "--exclusive",
            "--",
            "sh",
            "-c",
            f"while [ ! -e {excl_go} ]; do sleep 0.02; done",
        ],
        env=k.env,
    )
    wait_for(lambda: k.status()["queue"]["parked"] == 1)
    # A slot is free, but the parked exclusive request has reserved the GPU.
    late = subprocess.Popen([*k.krex, "run", "--", "true"], env=k.env)
    wait_for(lambda: k.status()["queue"]["parked"] == 2)
    go.write_text("")
    assert shared.wait(20) == 0
    wait_for(lambda: any(t["exclusive"] for t in k.status()["tenants"]))
    st = k.status()
    assert st["gpus"][0]["exclusive"] and st["gpus"][0]["slots_used"] == 2
    assert st["queue"]["parked"] == 1 and late.poll() is None
    excl_go.write_text("")
    assert excl.wait(20) == 0 and late.wait(20) == 0


def test_shutdown_answers_parked_and_ends_running_commands(krexd_factory: Factory) -> None:
    k = krexd_factory(slots=1)
    running = subprocess.Popen(
        [*k.krex, "run", "--", "sleep", "60"], env=k.env, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: len(k.status()["tenants"]) == 1)
    parked = subprocess.Popen(
        [*k.krex, "run", "--", "true"], env=k.env, stderr=subprocess.PIPE, text=True
    )
    wait_for(parked_is(k, 1))
    assert k.stop() == 0
    _, err = parked.communicate(timeout=20)
    assert parked.returncode == 69 and "SHUTTING_DOWN" in err
    running.communicate(timeout=20)
    assert running.returncode == 137


def test_grant_log_records_each_admission(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory(fake_gpus=2, slots=1)
    log = tmp_path / "grants.jsonl"
    show = "import os; print(os.environ['KREX_TENANT'], os.environ['KREX_GPU'])"
    before = time.time()
    for _ in range(2):
        p = krex_run(k, "--gpu", "1", "--grant-log", str(log), "--", PY, "-c", show)
        assert p.returncode == 0, p.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2  # appended, one line per admission
    tenant, gpu = p.stdout.split()
    last = lines[-1]
    assert (last["tenant"], last["gpu"]) == (int(tenant), int(gpu)) == (last["tenant"], 1)
    assert before <= lines[0]["time"] <= last["time"] <= time.time()
    assert all(line["admit_ms"] >= 0.0 for line in lines)
    # A log that cannot be written is a warning; the command still runs.
    p = krex_run(k, "--grant-log", str(tmp_path / "no" / "dir"), "--", "true")
    assert p.returncode == 0 and "cannot write the grant log" in p.stderr


def test_die_with_ends_the_command_when_its_parent_dies(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    k = krexd_factory()
    pidfile = tmp_path / "pid"
    # A parent that starts krex run --die-with <itself>, then waits (as a Ray worker would).
    parent = subprocess.Popen(
        [
            PY,
            "-c",
            "import os, subprocess, sys; "
            "subprocess.run(sys.argv[1:] + ['--die-with', str(os.getpid()), '--', "
            f"'sh', '-c', 'echo $$ > {pidfile}; exec sleep 60'])",
            *k.krex,
            "run",
        ],
        env=k.env,
    )
    wait_for(lambda: pidfile.is_file() and pidfile.read_text().strip() != "")
    cmd = int(pidfile.read_text())
    wait_for(lambda: len(k.status()["tenants"]) == 1)
    parent.kill()  # SIGKILL: no chance to clean up; the kernel signals krex run
    parent.wait()
    wait_for(lambda: gone(cmd))  # krexd killed the tenant once its launcher died
    wait_for(lambda: k.status()["tenants"] == [])
    # A PID that is not krex run's parent: it refuses to run at all.
    p = krex_run(k, "--die-with", "1", "--", "true")
    assert p.returncode == 2 and "not krex run's parent" in p.stderr
