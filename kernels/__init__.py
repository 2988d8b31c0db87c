"""Triton paged-attention kernels, their float64 reference and the GPU calibration harness.

Only `kvsim calibrate` (and the tests) import this package; the simulator never needs it.
"""
