"""``krex run --die-with PID``: end ``krex run`` when the process that started it ends.

For programs that start ``krex run`` and whose own death must end the
command, e.g. a Ray worker (``krex_client.cluster_task``): the kernel sends
``krex run`` SIGKILL when its parent thread exits (``prctl(2)``
``PR_SET_PDEATHSIG``), and krexd, which watches every launcher, then ends
the tenant and kills its cgroup.  Set here, in ``krex run`` itself, rather
than between ``fork`` and ``exec`` in the parent: that would need a
``preexec_fn``, which is unsafe in a multithreaded parent and rules out
``vfork``.  PID closes the race of a parent that died before the ``prctl``:
when ``krex run``'s parent is no longer PID, it exits at once.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def arm(parent: int) -> bool:
    """Ask for SIGKILL when the parent dies; False when ``parent`` is gone already.

    Raises OSError when the kernel refuses the ``prctl``.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return os.getppid() == parent
