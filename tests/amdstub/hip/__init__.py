"""Stand-in for hip-python's ``hip`` package (``from hip import hip``), for tests on hosts
without ROCm: see :mod:`hip.hip`.  Put ``tests/amdstub`` on ``sys.path`` (or PYTHONPATH for
a child process) to use it; nothing of the product imports it by path."""
