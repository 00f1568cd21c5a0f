"""Checks of the installed krex .deb, run inside the booted test container.

The host (tests/packaging/pkgtest_container.py) installs the package into a
clean Debian root, copies this directory to /opt/krex-pkgtest and boots the
root with ``systemd-nspawn -b``; krex-pkgtest.service runs this script with
systemd as PID 1, and the host reads the results afterwards.

Usage: ``python3 checks.py OUTDIR``. Writes ``OUTDIR/results.json``: a map
check name -> ``{"ok": bool, "detail": str}``, rewritten after every check
so a hang still leaves the earlier results; and ``OUTDIR/krexd.system.journal``.
Checks run in order; later ones (stop, remove, purge) change the system.
Standard library only: this runs on the container's /usr/bin/python3.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNIT = "krexd.service"
SOCKET = Path("/run/krex/krexd.sock")
CONFIG = Path("/etc/krex/krex.toml")
WORK = Path("/tmp/krex-pkgtest")
BENCH_USER = "bench"  # member of group krex
OUTSIDER = "nobody"  # not a member
ACTIVE_TIMEOUT_S = 60.0
WATCHDOG_WAIT_S = 5.0

results: dict[str, dict[str, object]] = {}


class CheckFailed(Exception):
    """A check observed something other than what it expects."""


def run(
    argv: list[str], timeout: float = 30.0, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (as ``user`` through runuser when given), capturing text output."""
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def show(*props: str) -> dict[str, str]:
    """``systemctl show`` properties of krexd.service."""
    out = run(["systemctl", "show", UNIT, *(f"--property={p}" for p in props)]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cgroup2_mount() -> Path:
    """Mount point of the cgroup v2 hierarchy (unified or hybrid host)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if " - cgroup2 " in line:
            return Path(line.split()[4])
    raise CheckFailed("no cgroup2 mount in /proc/self/mountinfo")


def proc_cgroup(pid: int) -> str:
    """The v2 cgroup path of ``pid`` (the ``0::`` line of /proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise CheckFailed(f"/proc/{pid}/cgroup has no cgroup v2 line")


def unit_pids(control_group: str) -> list[int]:
    """Every pid in the unit's cgroup subtree."""
    top = cgroup2_mount() / control_group.lstrip("/")
    pids: list[int] = []
    if top.is_dir():
        for procs in top.rglob("cgroup.procs"):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def wait_active() -> dict[str, str]:
    """Wait until krexd.service leaves "activating"; its properties then."""
    deadline = time.monotonic() + ACTIVE_TIMEOUT_S
    while True:
        props = show(
            "ActiveState",
            "SubState",
            "Type",
            "NotifyAccess",
            "MainPID",
            "StatusText",
            "ControlGroup",
            "Result",
            "NRestarts",
        )
        if props.get("ActiveState") != "activating" or time.monotonic() > deadline:
            return props
        time.sleep(0.2)


def check(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Record the outcome of the decorated check under ``name``.

    The check returns a detail string when it passes and raises when it
    does not; the result file is rewritten after each check.
    """

    def wrap(fn: Callable[[], str]) -> Callable[[], str]:
        def runner() -> str:
            try:
                detail = fn()
                results[name] = {"ok": True, "detail": detail}
            except Exception as exc:  # every failure becomes a result
                results[name] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
                detail = ""
            print(f"krex-pkgtest: {name}: {results[name]}", flush=True)
            OUT.joinpath("results.json").write_text(json.dumps(results, indent=1))
            return detail

        CHECKS.append(runner)
        return runner

    return wrap


CHECKS: list[Callable[[], str]] = []
OUT = Path("/var/lib/krex-pkgtest")


@check("service_active_via_notify")
def service_active() -> str:
    props = wait_active()
    if props.get("Type") != "notify":
        raise CheckFailed(f"unit Type is {props.get('Type')!r}, expected notify")
    # With Type=notify systemd moves the unit to active only on READY=1.
    if (props.get("ActiveState"), props.get("SubState")) != ("active", "running"):
        raise CheckFailed(f"krexd.service not active (running): {props}")
    return f"{props}"


@check("watchdog_pings")
def watchdog_pings() -> str:
    # systemd stamps WatchdogTimestamp on each WATCHDOG=1; two reads further
    # apart than the watchdog period (the test drop-in sets 4 s) must differ.
    first = show("WatchdogTimestampMonotonic", "WatchdogUSec")
    time.sleep(WATCHDOG_WAIT_S)
    second = show("WatchdogTimestampMonotonic", "ActiveState", "NRestarts")
    if first.get("WatchdogUSec") in (None, "0", "infinity"):
        raise CheckFailed(f"no watchdog configured: {first}")
    if second.get("WatchdogTimestampMonotonic") == first.get("WatchdogTimestampMonotonic"):
        raise CheckFailed(f"no WATCHDOG=1 within {WATCHDOG_WAIT_S} s: {first} {second}")
    if second.get("ActiveState") != "active" or second.get("NRestarts") != "0":
        raise CheckFailed(f"krexd did not stay up: {second}")
    return f"{first} -> {second}"


@check("unit_verify")
def unit_verify() -> str:
    res = run(
        [
            "systemd-analyze",
            "verify",
            "/lib/systemd/system/krexd.service",
            "/lib/systemd/system/krex.slice",
        ]
    )
    if res.returncode != 0 or res.stderr.strip():
        raise CheckFailed(f"rc={res.returncode} {res.stdout}{res.stderr}")
    return "systemd-analyze verify: clean"


@check("krexd_in_leaf_cgroup")
def krexd_in_leaf() -> str:
    props = show("MainPID", "ControlGroup")
    pid = int(props["MainPID"])
    unit_cg = props["ControlGroup"]
    own = proc_cgroup(pid)
    if not own.startswith(unit_cg.rstrip("/") + "/"):
        raise CheckFailed(f"krexd (pid {pid}) is in {own}, not below its unit cgroup {unit_cg}")
    own_dir = cgroup2_mount() / own.lstrip("/")
    children = [p.name for p in own_dir.iterdir() if p.is_dir()]
    if children:
        raise CheckFailed(f"krexd's cgroup {own} is not a leaf: children {children}")
    unit_procs = (cgroup2_mount() / unit_cg.lstrip("/") / "cgroup.procs").read_text().split()
    if unit_procs:
        raise CheckFailed(f"processes in the delegated unit cgroup itself: {unit_procs}")
    return f"unit {unit_cg}, krexd in {own}"


@check("socket_permissions")
def socket_permissions() -> str:
    st = SOCKET.stat()
    if not stat.S_ISSOCK(st.st_mode):
        raise CheckFailed(f"{SOCKET} is not a socket")
    group = grp.getgrgid(st.st_gid).gr_name
    mode = stat.S_IMODE(st.st_mode)
    if group != "krex" or mode & 0o007:
        raise CheckFailed(f"{SOCKET} is {oct(mode)} group {group}, expected group krex, no other")
    refused = run(["krexctl", "status"], user=OUTSIDER)
    if refused.returncode == 0:
        raise CheckFailed(f"user {OUTSIDER} (not in group krex) got a status: {refused.stdout}")
    return f"{oct(mode)} root:{group}; {OUTSIDER} refused rc={refused.returncode}"


@check("krexctl_status")
def krexctl_status() -> str:
    plain = run(["krexctl", "status"], user=BENCH_USER)
    if plain.returncode != 0:
        raise CheckFailed(f"krexctl status rc={plain.returncode}: {plain.stderr}")
    js = run(["krexctl", "status", "--json"], user=BENCH_USER)
    if js.returncode != 0:
        raise CheckFailed(f"krexctl status --json rc={js.returncode}: {js.stderr}")
    status = json.loads(js.stdout)
    gpus = status.get("gpus")
    if not gpus or len(gpus) != 1:
        raise CheckFailed(f"expected the 1 fake GPU in the status, got {gpus!r}")
    return plain.stdout.strip()[:2000]


@check("system_python_imports")
def system_python_imports() -> str:
    res = run(
        [
            "/usr/bin/python3",
            "-c",
            "import krex_cli, krex_client, krexd; "
            "print(krex_cli.__file__, krex_client.__file__, krexd.__file__)",
        ],
        user=BENCH_USER,
    )
    if res.returncode != 0:
        raise CheckFailed(res.stderr)
    if not all(p.startswith("/usr/lib/python3/dist-packages/") for p in res.stdout.split()):
        raise CheckFailed(f"imported from unexpected places: {res.stdout}")
    return res.stdout.strip()


@check("region_freezes_and_thaws_sibling")
def region_freezes() -> str:
    sib_file, out = WORK / "sibling.count", WORK / "holder.json"
    sibling = subprocess.Popen(
        [
            "runuser",
            "-u",
            BENCH_USER,
            "--",
            "krex",
            "run",
            "--",
            "/usr/bin/python3",
            str(HERE / "sibling.py"),
            str(sib_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        holder = run(
            [
                "krex",
                "run",
                "--",
                "/usr/bin/python3",
                str(HERE / "holder.py"),
                str(sib_file),
                str(out),
            ],
            timeout=90,
            user=BENCH_USER,
        )
        if holder.returncode != 0:
            raise CheckFailed(f"holder rc={holder.returncode}: {holder.stdout}{holder.stderr}")
        seen = json.loads(out.read_text())
    finally:
        sibling.terminate()
        try:
            sib_out = sibling.communicate(timeout=15)[0]
        except subprocess.TimeoutExpired:
            sibling.kill()
            sib_out = sibling.communicate()[0]
    if seen["at_end"] != seen["at_entry"]:
        raise CheckFailed(f"sibling ran inside the region: {seen}; sibling said {sib_out!r}")
    if seen["after"] <= seen["at_end"]:
        raise CheckFailed(f"sibling not thawed after the region: {seen}")
    if seen["cgroup_events_in_region"] and "frozen 1" not in seen["cgroup_events_in_region"]:
        raise CheckFailed(f"sibling cgroup not reported frozen: {seen}")
    return json.dumps(seen)


@check("journal_fields")
def journal_fields() -> str:
    """krexd's records carry journald fields: ``journalctl -u krexd EVENT=placed`` finds the
    commands the region check placed, each with its TENANT and GPU (issue "Operators can see
    a krex host", item 3)."""
    out = run(["journalctl", "-u", UNIT, "-o", "json", "--no-pager", "EVENT=placed"]).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not records:
        raise CheckFailed("no record of krexd.service with EVENT=placed")
    tenants = sorted({r.get("TENANT") for r in records})
    if None in tenants or any(r.get("GPU") is None for r in records):
        raise CheckFailed(f"a placed record without TENANT or GPU: {records[0]}")
    one = run(["journalctl", "-u", UNIT, "-o", "json", "--no-pager", f"TENANT={tenants[0]}"])
    mine = [json.loads(line) for line in one.stdout.splitlines() if line.startswith("{")]
    if not mine or any(r.get("TENANT") != tenants[0] for r in mine):
        raise CheckFailed(f"journalctl TENANT={tenants[0]} found {len(mine)} records")
    events = sorted({str(r.get("EVENT")) for r in mine})
    return f"{len(records)} placed records, tenants {tenants}; TENANT={tenants[0]}: {events}"


def _command_across(action: list[str], sleep_s: float = 8.0, code: int = 7) -> str:
    """A ``krex run`` whose command exits ``code`` after ``sleep_s``, with ``action`` run
    meanwhile: the command must end with its own code (no command lost)."""
    before = show("MainPID")["MainPID"]
    tenant = subprocess.Popen(
        [
            "runuser",
            "-u",
            BENCH_USER,
            "--",
            "krex",
            "run",
            "--",
            "sh",
            "-c",
            f"sleep {sleep_s}; exit {code}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(2.0)  # admitted and running
    done = run(action, timeout=120)
    try:
        out = tenant.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        tenant.kill()
        raise CheckFailed(f"krex run did not end after {action}") from None
    props = wait_active()
    if done.returncode != 0:
        raise CheckFailed(f"{action} rc={done.returncode}: {done.stdout}{done.stderr}")
    if tenant.returncode != code:
        raise CheckFailed(f"command lost across {action}: rc={tenant.returncode}: {out}")
    if props.get("MainPID") == before:
        raise CheckFailed(f"krexd was not restarted by {action}: {props}")
    return f"krexd {before} -> {props.get('MainPID')}; command exited {code}"


@check("restart_keeps_commands")
def restart_keeps_commands() -> str:
    return _command_across(["systemctl", "restart", UNIT])


@check("reinstall_keeps_commands")
def reinstall_keeps_commands() -> str:
    debs = sorted(Path("/root").glob("krex_*.deb"))
    if not debs:
        raise CheckFailed("no .deb in /root to reinstall")
    return _command_across(["apt-get", "install", "-y", "--reinstall", str(debs[-1])])


@check("watchdog_restart_keeps_commands")
def watchdog_restart_keeps_commands() -> str:
    # A hung event loop (SIGSTOP) misses WATCHDOG=1: systemd kills krexd (the
    # test drop-in's WatchdogSec) and restarts it; the new krexd adopts the command.
    pid = int(show("MainPID")["MainPID"])
    # Python's os.kill: a minimal root has no kill(1) (procps).
    stop = f"import os, signal; os.kill({pid}, signal.SIGSTOP)"
    return _command_across([sys.executable, "-c", stop], sleep_s=15.0)


@check("stop_leaves_no_process")
def stop_leaves_nothing() -> str:
    props = show("MainPID", "ControlGroup")
    unit_cg = props["ControlGroup"]
    if not unit_cg or props["MainPID"] == "0":
        raise CheckFailed(f"krexd is not running: {props}")
    tenant = subprocess.Popen(
        ["runuser", "-u", BENCH_USER, "--", "krex", "run", "--", "sleep", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 20
    pids = unit_pids(unit_cg)
    while len(pids) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = unit_pids(unit_cg)
    if len(pids) < 2:
        tenant.kill()
        raise CheckFailed(f"the tenant never appeared in {unit_cg}: pids {pids}")
    stop = run(["systemctl", "stop", UNIT], timeout=60)
    try:
        tenant.wait(timeout=15)
    except subprocess.TimeoutExpired:
        tenant.kill()
        raise CheckFailed("krex run did not end after krexd stopped") from None
    left = [p for p in pids if alive(p)]
    state = show("ActiveState", "Result")
    problems = []
    if stop.returncode != 0:
        problems.append(f"systemctl stop rc={stop.returncode} {stop.stderr}")
    if left:
        problems.append(f"processes left: {left}")
    if (cgroup2_mount() / unit_cg.lstrip("/")).exists():
        problems.append(f"cgroup {unit_cg} still exists")
    if SOCKET.parent.exists():
        problems.append(f"{SOCKET.parent} still exists")
    if state.get("ActiveState") != "inactive":
        problems.append(f"unit state {state}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"stopped; pids {pids} gone; krex run exited {tenant.returncode}"


@check("remove_keeps_config")
def remove_keeps_config() -> str:
    res = run(["apt-get", "remove", "-y", "krex"], timeout=120)
    if res.returncode != 0:
        raise CheckFailed(res.stdout + res.stderr)
    if Path("/usr/bin/krexd").exists():
        raise CheckFailed("/usr/bin/krexd still there after remove")
    if not CONFIG.is_file():
        raise CheckFailed(f"{CONFIG} removed by apt-get remove (a conffile must stay)")
    return f"{CONFIG} kept"


@check("purge_removes_config")
def purge_removes_config() -> str:
    res = run(["apt-get", "purge", "-y", "krex"], timeout=120)
    if res.returncode != 0:
        raise CheckFailed(res.stdout + res.stderr)
    left = [
        str(p)
        for p in (CONFIG, CONFIG.parent, Path("/etc/systemd/system/multi-user.target.wants") / UNIT)
        if p.exists() or p.is_symlink()
    ]
    if left:
        raise CheckFailed(f"left after purge: {left}")
    return "config and enablement links gone"


def setup() -> None:
    """Test users and a scratch directory."""
    WORK.mkdir(mode=0o1777, exist_ok=True)
    os.chmod(WORK, 0o1777)
    try:
        pwd.getpwnam(BENCH_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--groups", "krex", BENCH_USER], check=True)


def main() -> int:
    """Run every check in order; exit 0 when all passed."""
    global OUT
    OUT = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        setup()
    except (OSError, subprocess.CalledProcessError) as exc:
        results["setup"] = {"ok": False, "detail": str(exc)}
    for c in CHECKS:
        c()
    journal = run(["journalctl", "--no-pager", "-o", "short-monotonic", "-u", UNIT])
    OUT.joinpath("krexd.system.journal").write_text(journal.stdout + journal.stderr)
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
