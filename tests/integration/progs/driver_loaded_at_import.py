"""A module that loads the CUDA driver when imported but never calls it (as some torch builds do).

A pool may serve after it: an uninitialised driver is a clean start for a fork.
"""

import ctypes

DRIVER = ctypes.CDLL("libcuda.so.1")
