"""A module whose import fails half-way (a pool must not serve a half-imported state)."""

import json  # noqa: F401 - imported before the failure

raise RuntimeError("broken on purpose")
