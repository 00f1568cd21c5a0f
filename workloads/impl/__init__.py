"""GPU kernels of the corpus' candidates (Triton kernels, CUDA sources).

Kept apart from the family scripts so that ``<family>.py --list`` never
imports a GPU framework: a family imports its ``impl`` module inside
``build()`` only.  Every launcher uses the current device and the current
stream, as agents' candidates do.
"""
