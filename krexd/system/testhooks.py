"""Test-only pause points of the control plane (environment ``KREX_TEST_PAUSE_AT``).

The first time krexd reaches the named step it logs ``test pause at
<step>`` and blocks its whole event loop for ``KREX_TEST_PAUSE_S`` seconds
(default 60), so a restart test can kill it exactly there (:func:`pause`).
Without the variable this is one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import time

_log = logging.getLogger("krexd.testhooks")
_done: set[str] = set()


def pause(step: str) -> None:
    """Block here once when ``KREX_TEST_PAUSE_AT`` names ``step`` (tests only).

    The steps: ``admitted`` (tenant made, admit not yet answered),
    ``placed`` (pid in the cgroup, place not yet answered), ``closed`` (gate
    closed, step 2), ``drained`` (step 3), ``frozen`` (step 4), ``granted``
    (region held, grant not yet answered), ``thawed`` (exit: siblings
    thawed, gate not yet reopened), ``pool_register`` (a warm pool's
    registration, before its zygote is moved into the pool's cgroup),
    ``pool_counted`` (the zygote's threads counted, before the move).
    """
    if os.environ.get("KREX_TEST_PAUSE_AT") != step or step in _done:
        return
    _done.add(step)
    _log.warning("test pause at %s", step)
    time.sleep(float(os.environ.get("KREX_TEST_PAUSE_S", "60")))
