"""Held kernel-file descriptors (krexd.system.heldfiles): /proc/<pid>/stat, a tenant's cgroup files.

Real processes and, for the cgroup half, real cgroups: a held descriptor
must read the current state with no new open, must never outlive its
process or cgroup (a reaped process reads as gone and its descriptor is
closed; a cgroup removed and made again is read afresh), and the stat cache
must stay within its bound.
"""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from krexd.cgroups import CgroupBackend, fs
from krexd.cgroups.tenant import TenantCgroup
from krexd.config.config import CgroupConfig, CpuConfig
from krexd.hardware.inventory import fake_gpus
from krexd.hardware.slices import compute_slices
from krexd.system import procfs
from krexd.system.heldfiles import HeldFile
from krexd.system.procfs import STAT_FILES, StatFiles, proc_stat, stat_limit
from krexd.tenancy.registrations import identity


def held_under(prefix: str) -> list[str]:
    """What this process's descriptors open under ``prefix`` (``/proc/self/fd`` links)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the descriptor listdir itself used
        if target.startswith(prefix):
            out.append(target)
    return out


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path ``os.open`` is asked to open from now on."""
    seen: list[str] = []
    real = os.open

    def counting(path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
        seen.append(os.fsdecode(path))
        return real(path, flags, mode, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting)
    return seen


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["sleep", "60"])
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def wait_state(pid: int, state: bytes) -> None:
    deadline = time.monotonic() + 5
    while True:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == state:
                return
        assert time.monotonic() < deadline, f"pid {pid} never showed state {state!r}"
        time.sleep(0.01)


# --- /proc/<pid>/stat ----------------------------------------------------------------


def test_a_reaped_process_reads_as_gone_and_its_descriptor_is_closed(
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    p = sleeper()
    assert proc_stat(p.pid) == (os.getpid(), start_ticks(p.pid))
    assert identity(p.pid) is not None
    assert p.pid in STAT_FILES
    assert held_under(f"/proc/{p.pid}/") == [f"/proc/{p.pid}/stat"]
    p.kill()
    p.wait()
    assert proc_stat(p.pid) is None
    assert identity(p.pid) is None
    assert p.pid not in STAT_FILES
    assert held_under(f"/proc/{p.pid}/") == []


def test_a_zombie_reads_as_gone_through_its_held_descriptor(
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    p = sleeper()
    assert procfs.pid_alive(p.pid)
    p.kill()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
    assert not procfs.pid_alive(p.pid) and identity(p.pid) is None
    p.wait()
    assert not procfs.pid_alive(p.pid) and p.pid not in STAT_FILES


def test_a_held_descriptor_reads_the_current_state_without_a_new_open(
    sleeper: Callable[[], subprocess.Popen[bytes]], opens: list[str]
) -> None:
    p = sleeper()
    wait_state(p.pid, b"S")
    files = StatFiles(8)
    assert files.read(p.pid).rsplit(b")", 1)[1].split()[0] == b"S"
    os.kill(p.pid, signal.SIGSTOP)
    wait_state(p.pid, b"T")
    assert files.read(p.pid).rsplit(b")", 1)[1].split()[0] == b"T"
    os.kill(p.pid, signal.SIGCONT)
    wait_state(p.pid, b"S")
    assert files.read(p.pid).rsplit(b")", 1)[1].split()[0] == b"S"
    assert opens.count(f"/proc/{p.pid}/stat") == 1
    files.clear()


def test_the_cache_holds_at_most_its_bound_and_closes_what_it_evicts(
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    procs = [sleeper() for _ in range(5)]
    files = StatFiles(3)
    for p in procs:
        files.read(p.pid)
    assert len(files) == 3

    def held() -> set[int]:
        return {p.pid for p in procs if held_under(f"/proc/{p.pid}/")}

    assert held() == {p.pid for p in procs[2:]}  # the least recently read went first
    files.read(procs[2].pid)  # now the most recent: procs[3] is the oldest
    files.read(procs[0].pid)
    assert held() == {procs[0].pid, procs[2].pid, procs[4].pid}
    files.clear()
    assert len(files) == 0 and held() == set()


def test_the_bound_stays_well_inside_the_descriptor_limit() -> None:
    assert stat_limit(1024) == 256
    assert stat_limit(65536) == 512
    assert stat_limit(resource.RLIM_INFINITY) == 512
    assert stat_limit(32) == 16
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert STAT_FILES.limit == stat_limit(soft)


def test_a_file_longer_than_one_kernel_buffer_is_read_whole() -> None:
    """A seq file gives about a page a read: a short read is not its end."""
    many_maps = (
        "import mmap, sys, time\n"
        "m = [mmap.mmap(-1, 4096, prot=mmap.PROT_READ | (i % 2) * mmap.PROT_WRITE)"
        " for i in range(400)]\n"
        "print(flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", many_maps], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"\n"
        path = f"/proc/{p.pid}/maps"
        with open(path, "rb") as f:
            whole = f.read()
        fd = os.open(path, os.O_RDONLY)
        try:
            assert len(os.pread(fd, 65536, 0)) < len(whole)  # one read is not all of it
        finally:
            os.close(fd)
        held = HeldFile(path)
        assert held.read() == whole
        assert held.read() == whole  # again, from offset 0
        held.close()
    finally:
        p.kill()
        p.wait()


# --- a tenant's cgroup files ------------------------------------------------------------


@pytest.fixture
def backend() -> Iterator[CgroupBackend]:
    slices = compute_slices(fake_gpus(1), CpuConfig(reserved_cores=1, allow_shared=True))
    b = CgroupBackend.open(CgroupConfig(name=f"krexheld{os.getpid()}"))
    b.prepare(slices)
    yield b
    asyncio.run(b.teardown())


def empty(cg: TenantCgroup, p: subprocess.Popen[bytes]) -> None:
    p.kill()
    p.wait()
    assert asyncio.run(cg.wait_empty(5.0))


@pytest.mark.root
def test_freeze_thaw_and_pids_repeat_through_held_descriptors(
    backend: CgroupBackend, sleeper: Callable[[], subprocess.Popen[bytes]], opens: list[str]
) -> None:
    cg = backend.create_tenant(0, 1)
    p = sleeper()
    cg.add_pid(p.pid)
    for round_ in range(3):
        if round_ == 1:
            opens.clear()  # the first round opened the files
        assert cg.pids() == [p.pid]
        cg.freeze()
        assert asyncio.run(cg.wait_frozen(5.0)) and cg.is_frozen()
        cg.thaw()
        deadline = time.monotonic() + 2
        while cg.is_frozen():
            assert time.monotonic() < deadline, "not thawed"
            time.sleep(0.01)
        cg.set_cpus(cg.cores)
    assert [o for o in opens if any(o.startswith(d + "/") for d in cg.paths)] == []
    held = sorted(h for d in cg.paths for h in held_under(d + "/"))
    expected = [
        os.path.join(cg.path, n) for n in ("cgroup.events", "cgroup.freeze", "cgroup.procs")
    ]
    if cg.cpuset_dir is not None:
        expected.append(os.path.join(cg.cpuset_dir, "cpuset.cpus"))
    assert held == sorted(expected)
    empty(cg, p)
    cg.remove()
    assert [h for d in cg.paths for h in held_under(d + "/")] == []


@pytest.mark.root
def test_a_cgroup_removed_and_made_again_is_read_afresh(
    backend: CgroupBackend, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    cg = backend.create_tenant(0, 2)
    p = sleeper()
    cg.add_pid(p.pid)
    cg.freeze()
    assert asyncio.run(cg.wait_frozen(5.0))
    cg.thaw()
    empty(cg, p)
    os.rmdir(cg.path)  # behind the held descriptors' back
    # Gone: the same answers and errors as opening the files every time.
    assert cg.pids() == [] and not cg.populated()
    with pytest.raises(fs.CgroupError) as held_exc:
        cg.freeze()
    with pytest.raises(fs.CgroupError) as path_exc:
        fs.write(os.path.join(cg.path, "cgroup.freeze"), "1")
    assert held_exc.value.errno == errno.ENOENT
    assert str(held_exc.value) == str(path_exc.value)
    with pytest.raises(fs.CgroupError, match="cannot read .*cgroup.events"):
        cg.is_frozen()
    assert held_under(cg.path + "/") == []
    # Made again at the same path: read as the new cgroup.
    os.mkdir(cg.path)
    join_freeze_thaw(cg, sleeper())
    assert held_under(cg.path + "/") == []


@pytest.mark.root
def test_a_stale_descriptor_is_replaced_without_an_error(
    backend: CgroupBackend, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    """Removed and made again between two uses: the held descriptor fails (ENODEV) and the
    use is made once more on the new file, as an open-every-time read would be."""
    cg = backend.create_tenant(0, 3)
    assert cg.pids() == [] and not cg.is_frozen()  # the files are held now
    os.rmdir(cg.path)
    os.mkdir(cg.path)
    join_freeze_thaw(cg, sleeper())


def join_freeze_thaw(cg: TenantCgroup, p: subprocess.Popen[bytes]) -> None:
    """``p`` joins ``cg`` (made afresh at its path), which freezes, thaws and is removed."""
    fs.write(os.path.join(cg.path, "cgroup.procs"), str(p.pid))
    assert cg.pids() == [p.pid]
    cg.freeze()
    assert asyncio.run(cg.wait_frozen(5.0))
    assert fs.events(cg.path)["frozen"] == 1
    cg.thaw()
    assert fs.events(cg.path)["frozen"] == 0
    empty(cg, p)
    cg.remove()


# --- pidfds: liveness without reading stat ---------------------------------------------


def pidfds() -> int:
    """How many pidfds this process holds (``/proc/self/fd`` links)."""
    return len([t for t in held_under("anon_inode:") if "pidfd" in t])


def test_a_known_process_is_judged_alive_without_reading_its_stat(
    sleeper: Callable[[], subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Region entry asks every sibling process's identity twice: after the first answer a
    poll of its pidfd says it lives (its stat costs microseconds of kernel work each read)."""
    p = sleeper()
    first = identity(p.pid)
    assert first is not None and first.start_ticks == start_ticks(p.pid)
    reads: list[int] = []
    real = STAT_FILES.read
    monkeypatch.setattr(STAT_FILES, "read", lambda pid: reads.append(pid) or real(pid))
    for _ in range(10):
        assert identity(p.pid) == first
        assert procfs.pid_alive(p.pid)
    assert reads == []
    p.kill()
    p.wait()
    assert identity(p.pid) is None and not procfs.pid_alive(p.pid)


def test_a_gone_process_loses_its_pidfd_and_the_bound_holds(
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    handles = procfs.Handles(limit=2)
    before = pidfds()
    procs = [sleeper() for _ in range(3)]
    for p in procs:
        assert handles.start_of(p.pid) == start_ticks(p.pid)
    assert len(handles) == 2 and pidfds() == before + 2  # the first one was closed
    procs[2].kill()
    procs[2].wait()
    assert handles.start_of(procs[2].pid) is None
    assert len(handles) == 1 and pidfds() == before + 1
    handles.clear()
    assert pidfds() == before


def test_a_zombie_is_gone_through_its_held_pidfd(
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    p = sleeper()
    handles = procfs.Handles(limit=4)
    assert handles.start_of(p.pid) is not None
    p.kill()
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
    assert handles.start_of(p.pid) is None
    p.wait()


def test_pidfds_numbered_above_1024_are_polled(
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    """A long-running krexd holds more than FD_SETSIZE descriptors: select() refused them
    (ValueError from every liveness question) and each refusal leaked the new pidfd."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard descriptor limit ({hard}) is below 1200")
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (max(soft, 1200) if soft != resource.RLIM_INFINITY else soft, hard)
    )
    filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        p = sleeper()
        handles = procfs.Handles(limit=4)
        before = pidfds()
        for _ in range(3):
            assert handles.start_of(p.pid) == start_ticks(p.pid)
        assert pidfds() == before + 1
        p.kill()
        p.wait()
        assert handles.start_of(p.pid) is None and pidfds() == before
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
