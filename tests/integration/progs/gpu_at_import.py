"""A module that calls the CUDA driver when imported (a pool must refuse to serve after it)."""

import fakegpu

fakegpu.init()
