"""``krexd [--config PATH] [--socket PATH] [--fake-gpus N] [--fake-vendor nvidia|amd]``: the daemon.

krexd always runs in the foreground: under systemd as a ``Type=notify``
service, by hand from a shell.  ``--foreground`` is accepted for
compatibility (units and scripts pass it) and changes nothing.

``krexd --prepare-restart [--config PATH]`` only writes the restart marker:
the next SIGTERM makes the running krexd leave its tenants running for its
successor instead of ending them (krexd/restarts/restart.py); the unit's ``ExecStop``
runs it when systemd's job is a restart.

Exit codes: 0 after a clean shutdown, 78 (EX_CONFIG) for an invalid
configuration or slice layout, or a state or socket directory that is not
root's alone (krexd/system/safe_dirs.py), 69 (EX_UNAVAILABLE) when the socket or the
cgroups cannot be set up, 77 (EX_NOPERM) when not root.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from krexd import __version__
from krexd.cgroups import CgroupError
from krexd.config.config import SYSTEM_CONFIG, ConfigError, load, with_overrides
from krexd.gate import GateError
from krexd.hardware.mps import MpsError
from krexd.server.server import ServerError
from krexd.system.errors import ExitCode
from krexd.system.journal import setup_logging
from krexd.system.notify import Notifier


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``krexd``."""
    p = argparse.ArgumentParser(
        prog="krexd",
        description="krex daemon: GPU tenant supervisor.\n\n"
        + (__doc__ or "").split("\n\n", 1)[1].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Accepted for compatibility (the default, and the only way krexd runs): not offered.
    p.add_argument("--foreground", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--config",
        metavar="PATH",
        help=f"TOML config (default: $KREX_CONFIG, else {SYSTEM_CONFIG} when it exists, "
        "else etc/krex.toml of a source checkout, else built-in defaults)",
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="control socket path (default: $KREX_SOCKET, else the config's [daemon] socket)",
    )
    p.add_argument("--fake-gpus", metavar="N", type=int, help="declare N simulated GPUs")
    p.add_argument(
        "--fake-vendor",
        choices=("nvidia", "amd"),
        help="vendor of the simulated GPUs (default: the config's [daemon] fake_vendor, nvidia)",
    )
    p.add_argument(
        "--prepare-restart",
        action="store_true",
        help="mark the next SIGTERM as a restart: running commands are kept and adopted",
    )
    p.add_argument("--version", action="version", version=f"krexd {__version__}")
    return p


def _set_priority(nice: int) -> None:
    """Run krexd at nice value ``nice`` (``[daemon] nice``), before it starts any thread.

    A region's entry is krexd's work (close, drain, freeze, checks, state
    save) while the GPU's other commands still run: at the default nice
    they share every tenant core with krexd, and its entry time grew with
    their number on the H200 (docs/bench/gate-v2-h200.md).  Linux keeps nice
    per thread and a new thread inherits its creator's, so this is set
    before the first one.  A value the process may not take is logged, not
    fatal.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        logging.getLogger("krexd").warning("cannot set nice %d: %s", nice, exc)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``krexd`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    # Read and strip NOTIFY_SOCKET/WATCHDOG_* first: nothing we start may inherit them.
    notifier = Notifier.from_env()
    try:
        # --socket, then KREX_SOCKET (as for every krex command), then the config.
        socket = args.socket if args.socket is not None else os.environ.get("KREX_SOCKET") or None
        cfg = with_overrides(
            load(args.config),
            socket=socket,
            fake_gpus=args.fake_gpus,
            fake_vendor=args.fake_vendor,
        )
    except ConfigError as exc:
        print(f"krexd: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    # Under systemd: journald's native protocol with TENANT/GPU/EPOCH/EVENT/REASON fields.
    setup_logging(cfg.daemon.log_level, f"krexd[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    if os.geteuid() != 0:
        print("krexd: must run as root (it manages cgroups)", file=sys.stderr)
        return ExitCode.NOPERM
    if args.prepare_restart:
        from krexd.restarts.restart import prepare_restart

        prepare_restart(cfg)
        return ExitCode.OK
    from krexd.daemon import Daemon
    from krexd.system import safe_dirs

    try:
        safe_dirs.check(cfg)  # a state or socket directory others may write: refused
    except ConfigError as exc:
        print(f"krexd: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    _set_priority(cfg.daemon.nice)
    try:
        asyncio.run(Daemon(cfg, notifier).run())
    except ConfigError as exc:
        print(f"krexd: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    except (ServerError, CgroupError, MpsError, GateError) as exc:
        print(f"krexd: {exc}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    return ExitCode.OK
