"""``python -m krex_cli.replay ARGS``: the same as ``krex replay ARGS``."""

import sys

from krex_cli.replay.cli import build_parser, main

sys.exit(main(build_parser().parse_args()))
