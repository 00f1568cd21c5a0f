"""Honest commands in namespaces of their own: drained, never missed, never ended.

The scenes of tests/integration/test_attacks.py (real krexd, cgroups,
``krex run``, the shim, the fake driver's timeline as the witness), with an
honest command where the attacker stands: it launches 20 ms kernels
constantly, so a drain that skipped it would let them run inside a region,
and a registration krexd cannot verify would end it as "unprotectable"
(exit 79) at the first region's fail-closed check.

* ``unshare -pf`` without ``--mount-proc``: the command is pid 1 of a new
  pid namespace while ``/proc`` is still the host's, where ``/proc/1`` is
  the host's init.  Before the fix the shim read its start time from
  ``/proc/<getpid()>/stat``, i.e. init's, and was ended with exit 79.
* ``unshare -T --boottime``: a time namespace whose boot-time clock is
  shifted; ``/proc/<pid>/stat``'s start time is shown shifted by the
  reader's offset.  Before the fix the shim registered the shifted value
  and was ended with exit 79.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.integration.test_attacks import ATTACKER, scene

pytestmark = [pytest.mark.root, pytest.mark.serial]  # the scenes of test_attacks


def _time_namespaces() -> bool:
    """True when this kernel and unshare(1) make time namespaces with a boot-time offset."""
    try:
        r = subprocess.run(
            ["unshare", "-T", "--boottime", "1000", "-f", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _assert_protected(s: Any) -> None:
    """Never ended, launched throughout, and none of its kernels ran in a region."""
    assert s.attacker_rc is None, s.attacker_err[-2000:]  # never ended
    assert "unprotectable" not in s.log, s.log[-3000:]
    assert [r for r in s.records if r.pid == s.attacker_pid], "the command launched"
    assert s.violations(set()) == []


def test_a_pid_namespace_without_its_own_proc_is_drained_not_ended(
    krexd_factory: Any, tmp_path: Any
) -> None:
    s = scene(
        krexd_factory,
        tmp_path,
        ["unshare", "-pf", sys.executable, ATTACKER, "gpu", "20000000"],
        cycles=20,
    )
    assert s.attacker_pid == 1, "pid 1 of its namespace"
    _assert_protected(s)


@pytest.mark.skipif(not _time_namespaces(), reason="no time namespaces here")
def test_a_time_namespace_is_drained_not_ended(krexd_factory: Any, tmp_path: Any) -> None:
    s = scene(
        krexd_factory,
        tmp_path,
        ["unshare", "-T", "--boottime", "100000", "--monotonic", "-50", "-f"]
        + [sys.executable, ATTACKER, "gpu", "20000000"],
        cycles=20,
    )
    _assert_protected(s)


@pytest.mark.skipif(not _time_namespaces(), reason="no time namespaces here")
def test_both_namespaces_at_once(krexd_factory: Any, tmp_path: Any) -> None:
    s = scene(
        krexd_factory,
        tmp_path,
        ["unshare", "-pf", "-T", "--boottime", "7", "--", sys.executable, ATTACKER]
        + ["gpu", "20000000"],
        cycles=20,
    )
    _assert_protected(s)
