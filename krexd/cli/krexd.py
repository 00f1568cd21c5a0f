"""``krexd [--foreground] [--config PATH] [--socket PATH] [--fake-gpus N]``: the daemon.

Runs in the foreground (under systemd, ``Type=notify``; by hand, with
``--foreground``).  Exit codes: 0 after a clean shutdown, 78 (EX_CONFIG) for
an invalid configuration or slice layout, 69 (EX_UNAVAILABLE) when the
socket or the cgroups cannot be set up, 77 (EX_NOPERM) when not root.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from krexd import __version__
from krexd.cgroups import CgroupError
from krexd.config import ConfigError, load, with_overrides
from krexd.errors import ExitCode
from krexd.gate import GateError
from krexd.mps import MpsError
from krexd.notify import Notifier
from krexd.server import ServerError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``krexd``."""
    p = argparse.ArgumentParser(prog="krexd", description="krex daemon: GPU tenant supervisor")
    p.add_argument("--foreground", action="store_true", help="run in the foreground (default)")
    p.add_argument("--config", metavar="PATH", help="TOML config (default: etc/krex.toml)")
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="control socket path (default: $KREX_SOCKET, else the config's [daemon] socket)",
    )
    p.add_argument("--fake-gpus", metavar="N", type=int, help="declare N simulated GPUs")
    p.add_argument("--version", action="version", version=f"krexd {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``krexd`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    # Read and strip NOTIFY_SOCKET/WATCHDOG_* first: nothing we start may inherit them.
    notifier = Notifier.from_env()
    try:
        # --socket, then KREX_SOCKET (as for every krex command), then the config.
        socket = args.socket if args.socket is not None else os.environ.get("KREX_SOCKET") or None
        cfg = with_overrides(load(args.config), socket=socket, fake_gpus=args.fake_gpus)
    except ConfigError as exc:
        print(f"krexd: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    logging.basicConfig(
        level=cfg.daemon.log_level.upper(),
        format=f"krexd[{os.getpid()}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if os.geteuid() != 0:
        print("krexd: must run as root (it manages cgroups)", file=sys.stderr)
        return ExitCode.NOPERM
    from krexd.daemon import Daemon

    try:
        asyncio.run(Daemon(cfg, notifier).run())
    except ConfigError as exc:
        print(f"krexd: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    except (ServerError, CgroupError, MpsError, GateError) as exc:
        print(f"krexd: {exc}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    return ExitCode.OK
