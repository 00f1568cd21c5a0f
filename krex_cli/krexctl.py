"""``krexctl status [--json] [--socket PATH]``: what krexd is doing; ``krexctl top``: live.

Prints GPUs with their CPU slices, slots (and how many each GPU got:
``[admission] slots_per_gpu`` "auto" or fixed) and memory (used/total, what
admission may still give, allocations waiting for co-tenants' memory),
tenants (id, pid, command, state, age, memory peak/need and out-of-memory
outcome, then its current, learned and declared memory), the parked queue
(waiting for a slot or for memory), each GPU's region holder, its gate word
(``open``, or ``t<holder> e<epoch>`` while closed) and region counts
(``completed/granted``, then failed and recovered ones), the cgroup backend
in use, krexd's version and uptime, and the warm pools (``krex run --warm``:
pid, owner, age, commands served, memory, modules, key, interpreter; a user
sees only their own).  ``--json`` prints the ``status`` op's
reply as is (keys documented in docs/design/interfaces.md); when krexd is not
running or does not answer it prints
``{"state": "not running"|"unknown", "socket": PATH, "error": TEXT}``
instead, with the same exit code.

Exit codes (LSB ``status``): 0 krexd is running, 3 it is not running (no
socket, or nothing listens on it), 4 unknown (the socket accepts connections
but no valid answer came, or this user may not open it: the message then says
"permission denied" and names the group to join).

What a user sees of other users' tenants is need-to-know (the ``status`` op,
docs/design/interfaces.md): their id, GPU, state and age, not their command
line or pids.
"""

from __future__ import annotations

import argparse
import json
import socket as pysocket
import sys
from typing import Any

from krex_cli import __version__, help_text, top
from krex_cli.status_table import gpu_table, table
from krex_client.connection import (
    Connection,
    KrexPermissionDenied,
    KrexUnavailable,
    RemoteError,
    check_access,
    default_socket,
)
from krex_client.errors import StatusExit
from krex_client.sizes import format_size


def _listening(path: str) -> bool:
    """True when something accepts connections on the Unix socket ``path``."""
    s = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    if d:
        return f"{d}d{h:02d}h"
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _size_or_dash(value: Any) -> str:
    return "-" if value is None else format_size(int(value))


def _tenant_memory_cell(mem: Any) -> str:
    """``peak/need``, the out-of-memory outcome, then current, learned and declared sizes."""
    if not isinstance(mem, dict):
        return "-"
    cell = (
        f"{format_size(int(mem.get('peak_bytes', 0)))}/{format_size(int(mem.get('need_bytes', 0)))}"
    )
    if mem.get("exceeded"):
        cell += " over"
    if mem.get("waiting"):
        cell += " oom-wait"
    elif mem.get("outcome") not in (None, "ok"):
        cell += f" {mem['outcome']}"
    cell += (
        f" (now {_size_or_dash(mem.get('used_bytes'))},"
        f" learned {_size_or_dash(mem.get('learned_bytes'))},"
        f" declared {_size_or_dash(mem.get('declared_bytes'))})"
    )
    return cell


def _memory_line(m: Any) -> str:
    if not isinstance(m, dict):
        return "memory: not reported"
    return (
        f"memory ({m.get('source')}): admission {'on' if m.get('admission') else 'off'}, "
        f"default need {format_size(int(m.get('default_need_bytes') or 0))}, "
        f"headroom {format_size(int(m.get('headroom_bytes') or 0))}, "
        f"max bypass {m.get('max_bypass')}, co-tenant OOM wait {m.get('oom_wait_s')} s"
    )


def render(st: dict[str, Any]) -> str:
    """Human-readable status (the table ``krexctl status`` prints)."""
    gpus = st.get("gpus", [])
    lines = [*_header_lines(st), *_slot_rules(gpus), "", gpu_table(gpus), ""]
    lines.append(_tenant_table(st.get("tenants", [])))
    parked = (st.get("queue") or {}).get("queue", [])
    if parked:
        lines += ["", _parked_table(parked)]
    if isinstance(st.get("warm"), dict):
        lines += ["", _pools_section(st["warm"])]
    return "\n".join(lines)


def _slot_rules(gpus: list[dict[str, Any]]) -> list[str]:
    """One line per GPU: how its slots were chosen (``auto: 15 = min(...)`` or ``fixed: 4``)."""
    return [f"gpu{g['index']} slots {g['slots']['rule']}" for g in gpus if g.get("slots")]


def _pools_section(warm: dict[str, Any]) -> str:
    """``[warm]``'s limits, then one row per warm pool this user may see (root: all)."""
    cg = warm.get("cgroups") or {}
    memory = _size_or_dash(warm.get("memory_max") or None)
    head = (
        f"warm pools {'on' if warm.get('enabled') else 'off'}: at most "
        f"{warm.get('max_pools_per_uid')} per user, memory {memory} "
        f"({cg.get('memory', '-')}), idle {warm.get('idle_s', 0):g} s, "
        f"modules {', '.join(warm.get('modules') or []) or '-'}"
    )
    if "warm_starts" in warm:  # started since krexd's start, cold ones by reason
        why = ", ".join(f"{r} {n}" for r, n in (warm.get("cold_reasons") or {}).items())
        head += (
            f"\nstarts: {warm.get('warm_starts', 0)} warm, {warm.get('cold_starts', 0)} cold"
            + (f" ({why})" if why else "")
        )
    pools = warm.get("pools") or []
    if not pools:
        return head + "\nno warm pools"
    rows = [["POOL", "UID", "AGE", "COMMANDS", "MEMORY", "MODULES", "KEY", "INTERPRETER"]]
    for p in pools:
        rows.append(
            [
                str(p.get("pid")),
                str(p.get("uid")),
                _duration(p.get("age_s") or 0),
                str(p.get("commands", 0)),
                _size_or_dash(p.get("memory_bytes")),
                ",".join(p.get("modules") or []) or "-",
                str(p.get("key", ""))[:12],
                str(p.get("interpreter", "")),
            ]
        )
    return head + "\n" + table(rows)


def _header_lines(st: dict[str, Any]) -> list[str]:
    """krexd itself, its cgroups, its queue's totals and its memory policy."""
    cg = st.get("cgroups") or {}
    q = st.get("queue") or {}
    return [
        f"krexd {st['version']}  pid {st['pid']}  up {_duration(st['uptime_s'])}  "
        f"state {st['state']}",
        f"socket {st['socket']}  config {st.get('config') or '(built-in defaults)'}",
        f"cgroups {cg.get('backend', '?')} (cpuset: {cg.get('cpuset', '?')}) at {cg.get('root')}"
        + ("  [systemd]" if cg.get("systemd") else ""),
        _devices_line(cg.get("devices")),
        f"queue {q.get('parked', 0)} parked  "
        f"(granted {q.get('granted_total', 0)}, parked {q.get('parked_total', 0)} since start)",
        _memory_line(st.get("memory")),
    ]


def _devices_line(dev: dict[str, Any] | None) -> str:
    """Whether the kernel confines each tenant to its GPU's device node ([gpu] device_isolation)."""
    if not dev:
        return "device isolation: unknown (krexd too old to say)"
    if dev.get("active"):
        nodes = {int(g): f"/dev/nvidia{m}" for g, m in (dev.get("minors") or {}).items()}
        nodes.update(
            {int(g): f"/dev/dri/renderD{m}" for g, m in (dev.get("render_minors") or {}).items()}
        )
        minors = ", ".join(f"gpu{g} -> {node}" for g, node in sorted(nodes.items()))
        line = f"device isolation: active (each tenant may open only its own GPU: {minors})"
        unmanaged = dev.get("unmanaged_render") or []
        if unmanaged:
            names = ", ".join(f"renderD{m}" for m in unmanaged)
            line += f"; AMD GPUs krexd does not manage, denied to every command: {names}"
        return line
    if dev.get("mode") == "off":
        return "device isolation: off ([gpu] device_isolation = off)"
    return f"device isolation: inactive ({dev.get('reason') or '?'}); GPUs bound by environment"


def _tenant_table(tenants: list[dict[str, Any]]) -> str:
    """One row per tenant (another user's command line is not shown)."""
    if not tenants:
        return "no tenants"
    rows = [["TENANT", "GPU", "PID", "STATE", "AGE", "MEMORY", "COMMAND"]]
    for t in tenants:
        cmd = " ".join(" ".join(t.get("command", [])).split())  # one line, whatever argv holds
        if t.get("redacted"):
            cmd = "(another user's command)"
        rows.append(
            [
                f"t{t['id']}" + (" excl" if t.get("exclusive") else ""),
                str(t["gpu"]),
                str(t.get("pid") or "-"),
                t["state"],
                _duration(t["age_s"]),
                _tenant_memory_cell(t.get("memory")),
                cmd if len(cmd) <= 60 else cmd[:57] + "...",
            ]
        )
    return table(rows)


def _parked_table(parked: list[dict[str, Any]]) -> str:
    """One row per parked request, in queue order."""
    rows = [["PARKED", "GPU", "LAUNCHER", "WAITING", "FOR", "NEED", "COMMAND"]]
    for i, w in enumerate(parked, 1):
        rows.append(
            [
                str(i) + (" excl" if w.get("exclusive") else ""),
                "any" if w.get("gpu") is None else str(w["gpu"]),
                str(w.get("launcher_pid")),
                _duration(w.get("waiting_s", 0)),
                _waiting_for(w),
                format_size(int(w.get("mem_bytes") or 0)),
                " ".join(" ".join(w.get("command", [])).split())[:60],
            ]
        )
    return table(rows)


def _waiting_for(w: dict[str, Any]) -> str:
    """``slot``, or ``memory gpuN (bypassed K)``."""
    what = w.get("waiting_for") or "-"
    if what == "memory" and w.get("mem_gpu") is not None:
        what += f" gpu{w['mem_gpu']} (bypassed {w.get('bypassed', 0)})"
    return str(what)


def status(socket: str, as_json: bool) -> int:
    """Query krexd at ``socket`` and print its status; returns an LSB status exit code.

    With ``as_json`` every outcome is one JSON object on stdout: the ``status``
    reply, or ``{"state": "not running"|"unknown", "socket", "error"}``.
    """
    try:
        check_access(socket)
    except KrexPermissionDenied as exc:
        return _down(socket, as_json, StatusExit.UNKNOWN, f"{socket}: {exc.reason}")
    if not _listening(socket):
        return _down(socket, as_json, StatusExit.NOT_RUNNING, f"no daemon on {socket}")
    try:
        with Connection(socket, timeout_s=3.0) as conn:
            st = conn.request("status")
    except (KrexUnavailable, RemoteError) as exc:
        return _down(socket, as_json, StatusExit.UNKNOWN, str(exc))
    if as_json:
        print(json.dumps(st, indent=2, sort_keys=True))
    else:
        print(render(st))
    return StatusExit.RUNNING


def _down(socket: str, as_json: bool, code: StatusExit, error: str) -> int:
    """Report krexd not running (``code`` 3) or in an unknown state (4); returns ``code``."""
    state = "not running" if code == StatusExit.NOT_RUNNING else "unknown"
    if as_json:
        print(json.dumps({"state": state, "socket": socket, "error": error}, indent=2))
    elif code == StatusExit.NOT_RUNNING:
        print(f"krexd is not running ({error})", file=sys.stderr)
    else:
        print(f"krexd state unknown: {error}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``krexctl``."""
    p = argparse.ArgumentParser(
        prog="krexctl",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"krexctl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser(
        "status",
        help="show GPUs, slices, slots, tenants, queue, holder",
        description="Show what krexd is doing.  Exit codes: 0 running, 3 not running, "
        "4 unknown (see krexctl --help).",
    )
    st.add_argument("--json", action="store_true", help="machine-readable output")
    top.add_parser(sub)
    st.add_argument(
        "--socket",
        metavar="PATH",
        help="krexd's socket (default: $KREX_SOCKET or /run/krex/krexd.sock)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``krexctl``; returns the exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's usage, not krexctl's
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "status":
        return status(args.socket or default_socket(), args.json)
    if args.command == "top":
        return top.run(args.socket or default_socket(), args.interval, args.iterations)
    return StatusExit.UNKNOWN
