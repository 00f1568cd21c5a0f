"""Test-only pause points of the control plane (environment ``KREX_TEST_PAUSE_AT``).

The restart tests SIGKILL krexd at each step of a command's life and of the
region protocol.  With
``KREX_TEST_PAUSE_AT=<step>`` in krexd's environment, the first time krexd
reaches ``<step>`` it logs ``test pause at <step>`` and blocks its whole
event loop for ``KREX_TEST_PAUSE_S`` seconds (default 60), so the test can
kill it exactly there.  Steps: ``admitted`` (tenant made, admit not yet
answered), ``placed`` (pid in the cgroup, place not yet answered), ``closed``
(gate closed, step 2), ``drained`` (step 3), ``frozen`` (step 4),
``granted`` (region held, grant not yet answered), ``thawed`` (exit: siblings
thawed, gate not yet reopened), ``pool_register`` (a warm pool's
registration, before its zygote is moved into the pool's cgroup),
``pool_counted`` (the zygote's threads counted, before the move).  Without
the variable this is one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import time

_log = logging.getLogger("krexd.testhooks")
_done: set[str] = set()


def pause(step: str) -> None:
    """Block here once when ``KREX_TEST_PAUSE_AT`` names ``step`` (tests only)."""
    if os.environ.get("KREX_TEST_PAUSE_AT") != step or step in _done:
        return
    _done.add(step)
    _log.warning("test pause at %s", step)
    time.sleep(float(os.environ.get("KREX_TEST_PAUSE_S", "60")))
