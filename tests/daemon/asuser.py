"""Run a krex client as an unprivileged uid with no account: python -m tests.daemon.asuser.

    python -m tests.daemon.asuser UID GID [--root-child] krex ARGS...     # krex_cli.main
    python -m tests.daemon.asuser UID GID [--root-child] krexctl ARGS...  # krexctl
    python -m tests.daemon.asuser UID GID [--root-child] py CODE          # exec(CODE)

Started as root, it imports what the clients need first (the interpreter
lives where an unprivileged uid cannot read), optionally starts a root-owned
``sleep 120`` as its own child (``--root-child``: its pid is in ``ROOT_CHILD``
for CODE), then drops to UID/GID with no supplementary groups — every
capability goes with the uid change — and only then connects to krexd.  The
peer credentials krexd reads are those of the connecting process, so to krexd
this is an ordinary process of that uid.
"""

from __future__ import annotations

import contextlib
import encodings.idna  # noqa: F401 - imported before the uid change (see docstring)
import errno
import grp
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import msgpack  # noqa: F401
import zmq  # noqa: F401

import krex_cli.krexctl
import krex_cli.main
import krex_cli.run  # noqa: F401
from krex_client.connection import Connection, KrexUnavailable, RemoteError

_PRELOADED = (contextlib, errno, grp, json, select, shutil, signal, threading, time)


def _drop(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    assert os.getuid() == os.geteuid() == uid


def main(argv: list[str]) -> int:
    """See the module docstring."""
    uid, gid = int(argv[0]), int(argv[1])
    rest = argv[2:]
    root_child = None
    if rest and rest[0] == "--root-child":
        root_child = subprocess.Popen(
            ["sleep", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        rest = rest[1:]
    _drop(uid, gid)
    what, args = rest[0], rest[1:]
    if what == "krex":
        return int(krex_cli.main.main(args))
    if what == "krexctl":
        return int(krex_cli.krexctl.main(args))
    scope = {
        "Connection": Connection,
        "KrexUnavailable": KrexUnavailable,
        "RemoteError": RemoteError,
        "ROOT_CHILD": root_child.pid if root_child is not None else None,
        "json": json,
        "os": os,
        "sys": sys,
        "time": time,
        "subprocess": subprocess,
    }
    exec(compile(args[0], "<asuser>", "exec"), scope)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
