"""``krex ray-resources``: what this host offers a Ray cluster, read from krexd.

    krex ray-resources [--socket PATH] [--host NAME]
    krex ray-resources [--socket PATH] [--host NAME] --exec -- ray start --address H:P --block

krexd decides what runs on its host (slots, memory admission, regions); Ray
only places commands on hosts.  So that Ray never sends a host more commands
than krexd runs at once, each host's Ray node advertises krexd's own
capacity, taken from krexd's ``status`` reply rather than typed by hand:

* ``krex_slot``: krexd's slots, summed over its GPUs (a command through
  Ray asks for one: ``krex_client.cluster``);
* ``krex_gpu``: krexd's GPUs;
* ``krex_host_<NAME>``: as many as ``krex_slot``, so a command may be sent
  to one host by name (NAME: ``--host``, else ``$KREX_HOST``, else the host
  name; characters other than letters, digits, ``.``, ``-``, ``_`` become ``_``).

Without ``--exec`` it prints that JSON object, for ``ray start
--resources=...``.  With ``--exec`` it runs the command after ``--`` with
``--num-gpus N --resources JSON`` appended, and with ``KREX_SOCKET`` and
``KREX_HOST`` in its environment: Ray's node processes and its workers
inherit them, which is how a command run through Ray finds this host's krexd
(docs/install.md "Several hosts").  Ray's optional cgroup resource isolation
(``--enable-resource-isolation``) is refused: krexd alone writes the
commands' cgroups.

Exit codes: 0; 2 bad usage (no command after ``--exec``, resource isolation
asked for); 65 krexd reports no slot; 69 krexd unreachable; 77 permission
denied on its socket; 127/126 the command is not found / cannot run.  With
``--exec``, once started, the command replaces this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from krex_cli import help_text, unreachable
from krex_client.cluster import GPU, SLOT, host_name, host_resource
from krex_client.connection import (
    Connection,
    default_socket,
)
from krex_client.errors import ExitCode

ISOLATION_FLAG = "--enable-resource-isolation"
"""Ray's cgroup resource isolation (Ray >= 2.51, off by default): refused with --exec."""


def from_status(status: dict[str, Any], host: str) -> dict[str, float]:
    """The Ray resources of a host whose krexd's ``status`` reply is ``status``.

    Raises ValueError when krexd reports no slot (a Ray node without them
    would never run a krex command).
    """
    gpus = status.get("gpus") or []
    slots = sum(int(g.get("slots_total") or 0) for g in gpus)
    if slots <= 0:
        raise ValueError(f"krexd at {status.get('socket')} reports no slot (GPUs: {len(gpus)})")
    return {SLOT: float(slots), GPU: float(len(gpus)), host_resource(host): float(slots)}


def query(socket: str, host: str, timeout_s: float = 5.0) -> dict[str, float]:
    """Ask the krexd at ``socket`` (``ping``, then ``status``) for this host's Ray resources.

    Raises KrexUnavailable (KrexPermissionDenied), RemoteError or ValueError.
    """
    with Connection(socket, timeout_s=timeout_s) as conn:
        conn.request("ping")
        return from_status(conn.request("status"), host)


def resources_json(resources: dict[str, float]) -> str:
    """``resources`` as the JSON ``ray start --resources`` takes (whole numbers as integers)."""
    body = {k: int(v) if float(v).is_integer() else v for k, v in resources.items()}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def ray_start_args(resources: dict[str, float]) -> list[str]:
    """``--num-gpus N --resources JSON`` for ``ray start``."""
    return ["--num-gpus", str(int(resources[GPU])), "--resources", resources_json(resources)]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``ray-resources`` on the ``krex`` CLI's subparsers."""
    p = sub.add_parser(
        "ray-resources",
        help="print the Ray resources this host's krexd offers (or start Ray with them)",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="krexd's socket (default: $KREX_SOCKET or /run/krex/krexd.sock)",
    )
    p.add_argument("--host", metavar="NAME", help="this host's name in the cluster")
    p.add_argument(
        "--exec",
        dest="exec_",
        action="store_true",
        help="run the command after -- (e.g. ray start ...) with the resources appended",
    )
    p.add_argument("exec_argv", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    p.set_defaults(func=main)


def _say(msg: str) -> None:
    print(f"krex ray-resources: {msg}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    """Run ``krex ray-resources`` with parsed ``args``; returns the exit code (module docstring)."""
    command = list(args.exec_argv)
    if command and command[0] == "--":
        command = command[1:]
    if command and not args.exec_:
        _say("a command is given only with --exec")
        return ExitCode.USAGE
    if args.exec_ and not command:
        _say("--exec needs a command: krex ray-resources --exec -- ray start ...")
        return ExitCode.USAGE
    if ISOLATION_FLAG in command:
        _say(f"{ISOLATION_FLAG}: Ray must leave cgroups to krexd; start Ray without it")
        return ExitCode.USAGE
    socket = args.socket or default_socket()
    host = host_name(args.host)
    try:
        resources = query(socket, host)
    except unreachable.KREXD_ERRORS as exc:
        return unreachable.exit_code(exc, _say)
    except ValueError as exc:
        _say(str(exc))
        return ExitCode.DATAERR
    if not args.exec_:
        print(resources_json(resources))
        return 0
    env = dict(os.environ, KREX_SOCKET=os.path.abspath(socket), KREX_HOST=host)
    argv = command + ray_start_args(resources)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        _say(f"{argv[0]}: {exc.strerror}")
        return ExitCode.NOT_FOUND if isinstance(exc, FileNotFoundError) else ExitCode.CANNOT_EXEC
    return ExitCode.SOFTWARE  # not reached: execvpe returned
