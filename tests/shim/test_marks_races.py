"""Thread marks (``libkrex_shim/tenant/marks.h``) against signal handlers, slow exits and seccomp.

Each test runs with marks on and, as the control, off
(``KREX_SHIM_THREAD_MARKS=0``: every call on the slot's shared count, paused
at ``count_admitted`` instead of ``mark_admitted``):

* a gated call in a signal handler, interrupting a call admitted on the
  same thread's mark, must not uncount the interrupted call (the mark is a
  count);
* a call still in flight when the exit path's wait for the marks runs out
  (1 s) takes the exit step itself when it returns: the slot turns EXITING
  and later closures drain;
* a process that denies itself membarrier(2) after start (a seccomp
  filter) is not acknowledged: with marks on it fails closed (its drains
  time out naming it), with them off it drains.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from krexd.gate import Gate, GateTimeout
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild

from .procs import CuTenant
from .test_marks import HOLDER, KERNEL_NS, Armed, Drain, kernels_of

_libc = ctypes.CDLL(None, use_errno=True)
SYS_TGKILL = 234  # x86-64


def tgkill(pid: int, tid: int, sig: int) -> None:
    assert _libc.syscall(SYS_TGKILL, pid, tid, sig) == 0


@pytest.mark.parametrize("marks", ["1", "0"])
def test_a_gated_call_in_a_signal_handler_clears_the_outer_calls_mark(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path, marks: str
) -> None:
    """Outer launch admitted on its mark (paused before the driver); a SIGUSR1
    handler on the same thread makes a gated call, whose leave stores mark = 0.
    The outer launch is then in flight unseen: the drain must still wait."""
    armed = Armed(shim_build, fc, gate, tmp_path, skip=0)
    armed.env["KREX_SHIM_THREAD_MARKS"] = marks
    if marks == "0":
        armed.env["KREX_TEST_PAUSE"] = "count_admitted"  # no mark point without marks
    t = CuTenant(shim_build, armed.env)
    try:
        t.run("init")
        t.run("stream 1")
        t.run("sighandler")
        armed.arm()
        t.send(f"launch 1 1 {KERNEL_NS}")  # main thread: pauses at mark_admitted
        armed.wait_paused()
        tgkill(t.pid, t.pid, signal.SIGUSR1)  # the main thread is the pid
        r = t.reply(10)
        assert r["cmd"] == "sig" and r["rc"] == 0, r
        d = Drain(gate, 1)
        time.sleep(0.3)
        drained_early = d.done_ns is not None
        armed.release()
        assert t.reply(20)["rc"] == 0
        drained = d.join()
        time.sleep(0.4)
        ran = kernels_of(fc, t.pid)
        assert ran, "the launch never reached the device"
        inside = [k for k in ran if k[1] > drained]
        gate.reopen(HOLDER, 1)
        assert not drained_early, f"drained over a call in flight; kernels inside: {inside}"
        assert not inside, "the kernel ran inside the region"
    finally:
        t.close()


@pytest.mark.parametrize("marks", ["1", "0"])
def test_a_call_in_flight_over_a_second_at_exit_turns_the_slot_exiting_when_it_returns(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path, marks: str
) -> None:
    """A thread's call is in flight for 1.5 s when the process begins exiting; the
    process then stays alive in a teardown handler with nothing in flight and all
    its work synchronized.  A later closure should drain (EXITING, count 0)."""
    armed = Armed(shim_build, fc, gate, tmp_path, skip=1)
    armed.env["KREX_SHIM_THREAD_MARKS"] = marks
    if marks == "0":
        armed.env["KREX_TEST_PAUSE"] = "count_admitted"
    t = CuTenant(shim_build, armed.env)
    try:
        t.run("init")
        t.run("stream 1")
        armed.arm()
        t.send("bglaunchctx 1 1 1000000")  # its launch pauses
        armed.wait_paused()
        t.send("teardown")  # exit(0): the shim's exit path, then the teardown handler
        time.sleep(1.5)
        armed.release()
        replies = {t.reply(10)["cmd"], t.reply(10)["cmd"]}
        assert replies == {"bglaunch", "teardown"}, replies
        time.sleep(0.2)
        states = {s.state for s in gate.registrations() if s.pid == t.pid}
        gate.close(HOLDER, 5)
        try:
            gate.drain(HOLDER, 5, 2.0)
        finally:
            gate.reopen(HOLDER, 5)
        assert "exiting" in states, states
    finally:
        t.close()


SECCOMP_CODE = r"""
import ctypes, os, struct, sys, time
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0  # registers
assert cu.cuInit(0) == 0  # on this thread's mark (marks on)
libc = ctypes.CDLL(None, use_errno=True)
# deny membarrier (324) with EPERM, on every thread (TSYNC), as a self-sandboxing program might
ins = [(0x20, 0, 0, 0), (0x15, 0, 1, 324), (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7FFF0000)]
buf = ctypes.create_string_buffer(b"".join(struct.pack("<HBBI", *i) for i in ins))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Prog(len(ins), ctypes.cast(buf, ctypes.c_void_p))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.syscall(317, 1, 1, ctypes.byref(prog)) == 0, ctypes.get_errno()  # seccomp TSYNC
os.write(1, b"ready\n")
time.sleep(60)
"""


@pytest.mark.parametrize("marks", ["1", "0"])
def test_a_process_that_denies_itself_membarrier_is_not_acknowledged(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path, marks: str
) -> None:
    env = Armed(shim_build, fc, gate, tmp_path, skip=0).env
    env.pop("KREX_TEST_PAUSE")
    env["KREX_SHIM_THREAD_MARKS"] = marks
    p = subprocess.Popen([sys.executable, "-c", SECCOMP_CODE], env=env, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        gate.close(HOLDER, 7)
        try:
            if marks == "1":
                # No barrier: a marked call could be in flight unseen.  Fail closed.
                with pytest.raises(GateTimeout) as exc:
                    gate.drain(HOLDER, 7, 1.5)
                assert p.pid in {s.pid for s in exc.value.pending}
            else:
                gate.drain(HOLDER, 7, 1.5)  # nothing in flight, no GPU work queued
        finally:
            gate.reopen(HOLDER, 7)
    finally:
        p.kill()
        p.wait()
