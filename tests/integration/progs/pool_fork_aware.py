"""A module that starts a worker thread and stops it at every fork, as OpenBLAS does.

A warm pool that imports it may serve: its fork handler leaves one thread.
"""

import os
import threading

_stop = threading.Event()


def _work() -> None:
    _stop.wait()


def _start() -> None:
    global _thread
    _stop.clear()
    _thread = threading.Thread(target=_work, daemon=True)
    _thread.start()


def _stop_before_fork() -> None:
    _stop.set()
    _thread.join()


_thread: threading.Thread
_start()
os.register_at_fork(before=_stop_before_fork)
