"""Per-GPU orchestration and a command's life: one Gpu per GPU, the gate watch,
GPU-wide faults under MPS, the lifecycle (admit, place, end) and a command's environment.
"""
