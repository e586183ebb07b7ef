"""Pieces shared by the chunked kernels (linear attention, DeltaNet, Gated DeltaNet): the gate
cumsums, the blockwise triangular inverse, the sequential state pass and the per-chunk outputs."""
