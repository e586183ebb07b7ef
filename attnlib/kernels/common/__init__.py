"""Pieces shared by the kernels: launch helpers (device checks, tile widths, the device's limits, the
pruning of autotuning candidates), the one choice of product dtypes (``precision.py``), tile I/O, the
online-softmax tile updates of the softmax kernels, and for the chunked kernels (linear attention,
DeltaNet, Gated DeltaNet) the in-register triangular inverse, the sequential state passes and the
per-chunk outputs."""
