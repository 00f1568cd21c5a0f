"""``python -m krexd.replay ARGS``: the same as ``krex replay ARGS``."""

import sys

from krexd.replay.cli import build_parser, main

sys.exit(main(build_parser().parse_args()))
