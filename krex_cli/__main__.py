"""``python -m krex_cli ARGS``: the same as the ``krex`` command."""

import sys

from krex_cli.main import main

sys.exit(main())
