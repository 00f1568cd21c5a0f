"""``krex``: the user's command.

    krex run [--gpu N] [--timeout S] [--exclusive] [--mem SIZE] [--socket PATH] -- CMD ARGS...
    krex replay TRACE --mode native|serial|krex|ungated ...   (see krex replay -h)

``krex run`` exits with CMD's exit code (128+N when a signal N killed it),
124 when ``--timeout`` expired, 69 when krexd is unreachable, 126/127 when CMD
cannot be executed / is not found, 65 or 77 when krexd refused the request,
75 (EX_TEMPFAIL) when CMD failed after GPU out-of-memory errors that its
co-tenants caused (run it again; the failure is not the command's), 76 when
krexd ended CMD because it used the GPU where krex cannot drain it (no shim,
an exec'd program without it) or tampered with its gate registrations.
"""

from __future__ import annotations

import argparse
import sys

from krex_cli import __version__
from krex_cli.replay import cli as replay_cli
from krex_client.connection import default_socket
from krex_client.sizes import parse_size


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``krex``."""
    p = argparse.ArgumentParser(
        prog="krex", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"krex {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run one command as a krex tenant",
        description="Run CMD on a GPU shared through krexd.",
    )
    run.add_argument("--gpu", type=int, metavar="N", help="this GPU (default: least loaded)")
    run.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="S",
        help="kill CMD's process tree after S seconds (exit 124)",
    )
    run.add_argument(
        "--exclusive",
        action="store_true",
        help="wait until the GPU has no tenants, then hold it alone, unshimmed",
    )
    run.add_argument(
        "--mem",
        type=_size,
        metavar="SIZE",
        help="GPU memory CMD needs (bytes, or e.g. 512M, 4G): admitted only where it fits "
        "(default: krexd's [memory] default_need)",
    )
    run.add_argument(
        "--socket",
        metavar="PATH",
        help="krexd's socket (default: $KREX_SOCKET or /run/krex/krexd.sock)",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    replay_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``krex``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        cmd = list(args.cmd)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            parser.error("krex run needs a command: krex run [options] -- CMD ARGS...")
        if args.gpu is not None and args.gpu < 0:
            parser.error("--gpu must be >= 0")
        from krex_cli.run import run

        return run(
            cmd, args.socket or default_socket(), args.gpu, args.timeout, args.exclusive, args.mem
        )
    func = getattr(args, "func", None)
    if func is None:
        parser.error(f"unknown command {args.command!r}")
    return int(func(args))


if __name__ == "__main__":
    sys.exit(main())
