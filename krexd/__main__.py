"""``python -m krexd``: same as the ``krexd`` command."""

import sys

from krexd.cli.krexd import main

sys.exit(main())
