"""Hostile tenants over the full stack: none gets a kernel into a region or crashes krexd.

Real krexd, real cgroups, ``krex run``, the shim and the fake driver's
device timeline (tests/fakecuda) as the witness.  In each scene one honest
sibling launches kernels constantly, one attacker (progs/attacker.py) does
what the issues "Gate v2" (13, "Measured on main") and "Tenant identity"
(12, item 5) measured, and a holder runs short critical regions.  The
checks: krexd is alive and answers; no kernel of a tenant that was not
ended runs inside any region; an attacker krex cannot protect against is
ended with exit code 79 and a message naming the process and the cause.

On the code before gate v5 (checked by running these scenes against it):
the gate-word and truncate attacks succeed (the gate was group-writable:
the write hangs every sibling, the truncation kills krexd with SIGBUS),
relabelled slots let the attacker's kernels into regions, ``env -u
LD_PRELOAD`` and the exec into an unshimmed program run their kernels
inside regions (or time every drain out) with no one ended, and a command
under ``unshare -pf --mount-proc`` is judged dead by host pid 1 and not
drained.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakecuda import timeline
from tests.support import GPU_APIS, GpuApi, JsonLineReader

# serial: an attack that works without the lock must be seen working (the witness); two
# other test processes on the same cores can starve the attacker of its window.
pytestmark = [pytest.mark.root, pytest.mark.serial]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAKE_DIR = os.path.join(REPO, "build", "fakecuda")
FAKEGPU = os.path.join(REPO, "tests", "fakecuda", "fakegpu.py")
HOLDER = os.path.join(HERE, "progs", "timeline_holder.py")
ATTACKER = os.path.join(HERE, "progs", "attacker.py")
UNPROTECTABLE = 79
# Unprivileged, but in group 0: on the code before gate v5 the gate file
# was writable by the socket's group (the test krexd's is root's group).
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=0", "--clear-groups"]


@dataclass
class Scene:
    """What one scene left: the attacker's lines, exit code and stderr, the timeline."""

    holder_pid: int
    regions: list[list[int]]
    records: list[Any]
    attacker: list[dict[str, Any]]
    attacker_rc: int | None
    attacker_err: str
    log: str

    @property
    def attacker_pid(self) -> int:
        return int(self.attacker[0]["pid"])

    def violations(self, exclude: set[int]) -> list[Any]:
        """Records of pids not in ``exclude`` (nor the holder) overlapping a region."""
        out = []
        for s, e in self.regions:
            out += timeline.overlapping(self.records, s, e, {self.holder_pid, *exclude})
        return out


def scene(
    krexd_factory: Any,
    tmp_path: Any,
    attack: list[str],
    cycles: int = 60,
    settle_s: float = 0.5,
    driver_lock: bool = True,
    outside: list[str] | None = None,
    config: dict[str, dict[str, Any]] | None = None,
    api: GpuApi = GPU_APIS["cuda"],
) -> Scene:
    """Start an honest sibling and the attacker ``attack``, run ``cycles`` regions.

    ``driver_lock``: krexd locks the GPU's other processes through the fake
    driver at each entry (``KREX_DRIVER_LIB``), as it does on a real GPU;
    False: the shim's acknowledgements alone.  ``outside``: the attacker is
    started as a plain process, not through ``krex run`` (GPU use outside krex).
    ``api``: the fake every tenant drives (tests.support.GpuApi).
    """
    state = os.path.join(tmp_path, "fakestate")  # krexd reads who has the GPU open there
    kenv = {"KREX_FAKE_STATE": state, "KREX_DRIVER_LIB": os.path.join(FAKE_DIR, "libcuda.so.1")}
    if not driver_lock:
        config = {**(config or {}), "region": {"driver_lock": "off"}}
    k = krexd_factory(slots=6, env=kenv, config=config, args=list(api.krexd_args))
    tl = os.path.join(k.workdir, "timeline")
    env = dict(api.env(k.env, k.workdir), KREX_FAKE_TIMELINE=tl, KREX_FAKE_STATE=state)
    honest = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, FAKEGPU, "--seconds", "300"]
        + ["--kernel-ns", "100000", "--sync-every", "4"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    att = subprocess.Popen(
        outside if outside is not None else [*k.krex, "run", "--", *attack],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert att.stdout is not None
    lines = JsonLineReader(att.stdout, "attacker", lambda: f"rc {att.poll()}")
    try:
        lines.next(20)  # its pid: it started
        time.sleep(settle_s)  # the attack is made; the sibling keeps launching
        run = subprocess.run(
            [*k.krex, "run", "--", sys.executable, HOLDER, str(cycles), "3"],
            env=env,
            capture_output=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        assert k.proc.poll() is None, f"krexd died:\n{k.log()[-3000:]}"
        assert k.status()["state"] == "running"
        assert honest.poll() is None, "the honest sibling was ended"
    finally:
        try:
            # An attacker krexd ended went at the first region, long before the
            # holder's last: one still running now was not ended.
            rc: int | None = att.wait(1.5)
        except subprocess.TimeoutExpired:
            # A namespace's pid 1 ignores SIGTERM from outside: kill krex run
            # itself, and krexd ends the tenant (its launcher died).
            att.kill()
            att.wait(30)
            rc = None
        honest.terminate()
        honest.wait(30)
    out = json.loads(run.stdout.decode().strip().splitlines()[-1])
    try:
        lines.drain(5)
    except AssertionError:
        pass  # still running (never ended): what it said so far
    return Scene(
        out["pid"],
        out["regions"],
        timeline.read(tl),
        lines.lines,
        rc,
        att.stderr.read() if att.stderr else "",
        k.log(),
    )


def assert_ended_for(s: Scene, cause: str, names_pid: bool = True) -> None:
    """The attacker was ended with exit 79, krex run and krexd saying why."""
    assert s.attacker_rc == UNPROTECTABLE, (s.attacker_rc, s.attacker_err[-2000:])
    assert cause in s.attacker_err and cause in s.log, s.attacker_err
    if names_pid:
        assert f"pid {s.attacker_pid}" in s.attacker_err, s.attacker_err


# ---- issue 13: the shared memory ---------------------------------------------------------


def test_a_tenant_cannot_write_the_gate_word(krexd_factory: Any, tmp_path: Any) -> None:
    s = scene(krexd_factory, tmp_path, [*AS_NOBODY, sys.executable, ATTACKER, "gate-word"])
    assert {"denied": True} in s.attacker
    assert s.violations(set()) == [] and len(s.regions) == 60


def test_a_tenant_cannot_truncate_the_gate(krexd_factory: Any, tmp_path: Any) -> None:
    s = scene(krexd_factory, tmp_path, [*AS_NOBODY, sys.executable, ATTACKER, "truncate-gate"])
    assert {"denied": True} in s.attacker
    assert s.violations(set()) == []


def test_relabelled_slots_end_the_tenant(krexd_factory: Any, tmp_path: Any) -> None:
    """Its own slots claiming the holder's tenant (and a forged ack): detected, ended."""
    s = scene(krexd_factory, tmp_path, [sys.executable, ATTACKER, "relabel", "1"])
    assert {"written": True} in s.attacker
    assert_ended_for(s, "tampered with its gate registrations", names_pid=False)
    assert s.violations({s.attacker_pid}) == []


def test_garbage_in_the_slot_memory_ends_the_tenant_not_krexd(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """Every byte of its slot memory 0xff (a huge nslots of old, and worse)."""
    s = scene(krexd_factory, tmp_path, [sys.executable, ATTACKER, "garbage"])
    assert {"written": True} in s.attacker
    assert_ended_for(s, "tampered with its gate registrations", names_pid=False)
    assert s.violations({s.attacker_pid}) == []


def test_the_slot_memory_cannot_shrink_or_grow(krexd_factory: Any, tmp_path: Any) -> None:
    s = scene(krexd_factory, tmp_path, [sys.executable, ATTACKER, "truncate-slots"])
    assert any(line.get("shrink_denied") and line.get("grow_denied") for line in s.attacker)
    assert s.violations(set()) == []


def test_a_deleted_gate_file_is_restored_for_new_tenants(krexd_factory: Any, tmp_path: Any) -> None:
    k = krexd_factory(slots=4)
    gate = k.status()["gpus"][0]["gate"]
    os.unlink(gate)
    deadline = time.monotonic() + 5
    while not os.path.exists(gate):
        assert time.monotonic() < deadline, "gate file not restored"
        time.sleep(0.01)
    assert "removed or replaced; restored" in k.log()
    # Replaced by another file: restored too, and a new tenant is gated by krexd's.
    os.unlink(gate)
    with open(gate, "wb") as f:
        f.write(b"\0" * 4096)
    env = dict(k.env, LD_LIBRARY_PATH=FAKE_DIR, KREX_FAKE_STATE=os.path.join(k.workdir, "st"))
    code = "import ctypes; print(ctypes.CDLL(None).krex_shim_active())"
    out = subprocess.run(
        [*k.krex, "run", "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr


# ---- issue 12, item 5: GPU use krexd cannot drain --------------------------------------------


def test_env_u_ld_preload_ends_the_command(
    krexd_factory: Any, tmp_path: Any, gpu_api: GpuApi
) -> None:
    attack = ["env", "-u", "LD_PRELOAD", sys.executable, ATTACKER, "gpu"]
    s = scene(krexd_factory, tmp_path, attack, api=gpu_api)
    assert_ended_for(s, "shim is not loaded")
    assert s.violations({s.attacker_pid}) == []


def test_exec_into_an_unshimmed_program_ends_the_command(
    krexd_factory: Any, tmp_path: Any, gpu_api: GpuApi
) -> None:
    s = scene(krexd_factory, tmp_path, [sys.executable, ATTACKER, "exec-unshimmed"], api=gpu_api)
    assert_ended_for(s, "unprotectable GPU use")
    assert "DRAIN_TIMEOUT" not in s.log
    assert s.violations({s.attacker_pid}) == []


def test_another_pid_namespace_is_drained(krexd_factory: Any, tmp_path: Any) -> None:
    """Registered as pid 1 of its own namespace: krexd finds it and drains it.

    Its 20 ms kernels are always queued when a region begins: a drain that
    skipped it (host pid 1 judged dead, before gate v5) lets them run inside.
    """
    s = scene(
        krexd_factory,
        tmp_path,
        ["unshare", "-pf", "--mount-proc", sys.executable, ATTACKER, "gpu", "20000000"],
    )
    assert s.attacker_rc is None, s.attacker_err[-2000:]  # never ended: it is protected
    inner = {r.pid for r in s.records} - {s.holder_pid}
    assert 1 in inner, "the namespaced command launched (as pid 1 of its namespace)"
    assert s.violations(set()) == []


# ---- issue 28: exclusivity the tenant cannot subvert ------------------------------------------


def test_a_forged_acknowledgement_lets_no_queued_work_into_a_region(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """A thread acknowledges every closure at once while ~100 ms of kernels stay queued.

    The drain the shim reports returns at once; the driver's lock waits for
    the queued kernels, so none runs inside a region.
    """
    s = scene(krexd_factory, tmp_path, [sys.executable, ATTACKER, "self-ack"], cycles=20)
    assert {"forging": True} in s.attacker
    mine = [r for r in s.records if r.pid == s.attacker_pid]
    assert len(mine) > 100, "the attacker kept kernels queued"
    assert s.violations(set()) == []


def test_without_the_driver_lock_the_witness_catches_a_forged_acknowledgement(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """The same attack with the shim's word alone (no driver lock).

    The attack works (the timeline sees the attacker's kernels in a region:
    what the test above guards against), and the outside witness reports
    it: the region is flagged contaminated and the attacker ended (exit 79).
    """
    s = scene(
        krexd_factory,
        tmp_path,
        [sys.executable, ATTACKER, "self-ack"],
        cycles=10,
        driver_lock=False,
    )
    assert {s.attacker_pid} == {r.pid for r in s.violations(set())}
    assert "contaminated" in s.log and f"pid {s.attacker_pid}" in s.log
    assert_ended_for(s, "ran inside tenant", names_pid=False)


def test_a_second_driver_copy_is_refused_and_nothing_runs_in_a_region(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """Launches through a second copy of the driver loaded with RTLD_DEEPBIND.

    The shim refuses the load with one line (its calls would bypass the
    gate); were it loaded, the driver's lock covers it anyway (a lock holds
    the process, whichever copy calls: tests/fakecuda, "a second copy of
    the driver in the process is locked too").
    """
    plugin = os.path.join(tmp_path, "libcuda-plugin.so.1")
    shutil.copy(os.path.join(FAKE_DIR, "libcuda.so.1"), plugin)
    deep = os.path.join(FAKE_DIR, "bin", "fakedeep")
    cmd = f'echo "{{\\"pid\\": $$}}"; exec {deep} {plugin} 30 2000000'
    s = scene(krexd_factory, tmp_path, ["sh", "-c", cmd], cycles=30)
    assert "krex: refused dlopen" in s.attacker_err, s.attacker_err[-2000:]
    assert "RTLD_DEEPBIND" in s.attacker_err
    assert s.violations(set()) == []


def test_a_process_outside_krex_is_locked_for_every_region(
    krexd_factory: Any, tmp_path: Any
) -> None:
    """GPU use outside ``krex run`` (a tmux server, another user): locked, and named."""
    s = scene(
        krexd_factory,
        tmp_path,
        [],
        cycles=30,
        outside=[sys.executable, ATTACKER, "gpu", "5000000"],
    )
    mine = [r for r in s.records if r.pid == s.attacker_pid]
    assert mine, "the outside process launched"
    assert s.violations(set()) == []
    assert f"processes outside krex on the GPU (lock): pid {s.attacker_pid}" in s.log


def test_foreign_refuse_fails_entries_while_a_process_outside_krex_uses_the_gpu(
    krexd_factory: Any, tmp_path: Any
) -> None:
    state = os.path.join(tmp_path, "fakestate")
    lib = os.path.join(FAKE_DIR, "libcuda.so.1")
    k = krexd_factory(
        slots=4,
        env={"KREX_FAKE_STATE": state, "KREX_DRIVER_LIB": lib},
        config={"region": {"foreign": "refuse"}},
    )
    env = dict(k.env, LD_LIBRARY_PATH=FAKE_DIR, KREX_FAKE_STATE=state)
    outside = subprocess.Popen(
        [sys.executable, ATTACKER, "gpu"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert outside.stdout is not None
        outside.stdout.readline()
        time.sleep(0.3)
        run = subprocess.run(
            [*k.krex, "run", "--", sys.executable, HOLDER, "1", "3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode != 0
        assert "FOREIGN_GPU_USER" in run.stderr or "outside krex" in run.stderr, run.stderr
        assert f"pid {outside.pid}" in run.stderr
    finally:
        outside.kill()
        outside.wait()
