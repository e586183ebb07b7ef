"""Triton's interpreter, with its generic scan taken a step at a time instead of an element at a time.

The interpreter runs ``tl.associative_scan`` with a user combine function (ANNA's segmented sum) by
calling the combine function once per element of the block, each call building scalar tensors in
Python: a 16 x 16 tile costs 256 calls, and ANNA's tests spent most of their minutes there. The scan it
computes is sequential along the axis -- ``out[0] = x[0]``, ``out[k] = combine(out[k-1], x[k])`` -- and
independent across the other axes, so calling the combine function once per step along the axis, on
whole slices, gives the same numbers bit for bit (the same float32 operations in the same order, on
each element; ``tests/test_interpreter_scan.py`` compares the two on random inputs). Only the tests use
it (``tests/conftest.py``); the labs and a reader's interpreter run Triton's own.
"""

from __future__ import annotations

import numpy as np


def _at(ndim: int, axis: int, k: int) -> tuple:
    index = [slice(None)] * ndim
    index[axis] = k
    return tuple(index)


def generic_scan_by_step(self, input):
    """``ScanOps.generic_scan`` (``triton/runtime/interpreter.py``), one combine call per step along the axis."""
    import triton.language as tl

    data = [arg.handle.data for arg in input]
    out = [np.zeros(d.shape, dtype=d.dtype) for d in data]
    ndim, n = data[0].ndim, data[0].shape[self.axis]
    for j, d in enumerate(data):
        out[j][_at(ndim, self.axis, 0)] = d[_at(ndim, self.axis, 0)]
    for k in range(1, n):
        prev = tuple(self.to_tensor(o[_at(ndim, self.axis, k - 1)], input[j].dtype) for j, o in enumerate(out))
        here = tuple(self.to_tensor(d[_at(ndim, self.axis, k)], input[j].dtype) for j, d in enumerate(data))
        got = self.combine_fn.fn(*prev, *here)
        got = got if isinstance(got, tuple) else (got,)
        for j in range(len(out)):
            value = got[j].handle.data if isinstance(got[j], tl.core.tensor) else got[j]
            out[j][_at(ndim, self.axis, k)] = np.reshape(value, out[j][_at(ndim, self.axis, k)].shape)
    return [self.to_tensor(o, input[j].dtype) for j, o in enumerate(out)]


def install() -> None:
    from triton.runtime import interpreter

    if interpreter.ScanOps.generic_scan is not generic_scan_by_step:
        interpreter.ScanOps.triton_generic_scan = interpreter.ScanOps.generic_scan
        interpreter.ScanOps.generic_scan = generic_scan_by_step
