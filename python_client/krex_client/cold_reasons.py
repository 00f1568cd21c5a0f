"""Why a command started cold: the few categories ``krex run`` reports with ``place``.

``krex run`` says the full reason in one debug line (``krex run -v``); the
category rides on the ``place`` request that starts the command cold
(field ``cold``), so krexd can count cold starts by reason
(``krexctl status``, the ``krex_cold_starts_by_reason_total`` metric) with a
label set that never grows.  krexd counts a category it does not know as
:data:`OTHER`.  Imported by krexd and ``krex run``; standard library only.
"""

from __future__ import annotations

ASKED = "asked"
"""``krex run --cold``, or krexd's ``[warm] start = "cold"``."""
COMMAND = "command"
"""Not a command a pool can run: not Python, or its options or environment."""
NO_POOL = "no_pool"
"""No pool for the command's key yet: one is started for the commands to come."""
POOL_STARTING = "pool_starting"
"""The key's pool is still starting (importing its modules)."""
POOL_REFUSED = "pool_refused"
"""The key's last pool refused to serve (its reason is in ``krex run -v``)."""
MISMATCH = "mismatch"
"""The pool cannot reproduce this ``krex run``: version, key, credentials, limits."""
POOL_DIRECTORY = "pool_directory"
"""The user's pool directory is missing or unsafe."""
ERROR = "error"
"""Any other failure while trying the pool (a pool never makes a command fail)."""
OTHER = "other"
"""krexd's category for a reason it does not know (a newer client)."""

REASONS = (ASKED, COMMAND, NO_POOL, POOL_STARTING, POOL_REFUSED, MISMATCH, POOL_DIRECTORY, ERROR)
"""Every category a client may send."""
