"""Input checks shared by every public op, and their error messages -- written once.

Messages name the argument, what was expected and what came, e.g.
``k has shape (2, 4, 50, 16); expected (2, 4, *, 32) to match q (batch, heads, dim)``.

Two kinds of check, one rule:

* **Shapes, dtypes, devices, Python parameters** -- always checked: they live on the host and cost
  nothing.
* **Values** (finite entries, ranges such as ``beta in [0, 2]``) -- reading a tensor's values on a GPU
  is a device-to-host synchronisation, which would stall every call of an op inside a training loop
  or a timed benchmark. So values are checked where reading them is free -- tensors on the CPU --
  and on other devices only on request: set the environment variable ``ATTNLIB_CHECK_VALUES=1``
  (read at each call, so it can be switched on while debugging). :func:`checks_values` is that rule.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from ._numerics import acc_dtype

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_tensor(name: str, x, *, ndim: int | None = None, dtypes=FLOAT_DTYPES,
                 min_ndim: int | None = None) -> torch.Tensor:
    """Check that ``x`` is a tensor of one of ``dtypes`` with ``ndim`` (or at least ``min_ndim``) dims."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if dtypes is not None and x.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(x.dtype).replace('torch.', '')}; expected one of {allowed}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} has shape {_shape(x)} ({x.dim()} dims); expected {ndim} dims"
                         + (" [batch, heads, time, dim]" if ndim == 4 else ""))
    if min_ndim is not None and x.dim() < min_ndim:
        raise ValueError(f"{name} has shape {_shape(x)}; expected at least {min_ndim} dims")
    return x


def check_same_device_dtype(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    (n0, t0), *rest = named
    for n, t in rest:
        if t.device != t0.device:
            raise ValueError(f"{n} is on {t.device}; expected {t0.device} to match {n0}")
        if t.dtype != t0.dtype:
            raise TypeError(f"{n} has dtype {str(t.dtype).replace('torch.', '')}; expected "
                            f"{str(t0.dtype).replace('torch.', '')} to match {n0}")


def check_qkv(q, k, v, *, same_length: bool = False,
              allow_no_keys: bool = False) -> tuple[int, int, int, int, int, int]:
    """Validate attention inputs ``q: [B, H, Tq, D]``, ``k: [B, H, Tk, D]``, ``v: [B, H, Tk, Dv]``.

    ``same_length``: the op is causal, so ``Tq == Tk``. ``allow_no_keys``: ``Tk == 0`` with ``Tq > 0``
    is allowed (for ops whose rows may be empty, such as ANNA's); softmax over no keys is undefined.

    Returns ``(B, H, Tq, Tk, D, Dv)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4)
    check_same_device_dtype([("q", q), ("k", k), ("v", v)])
    B, H, Tq, D = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != D:
        raise ValueError(f"k has shape {_shape(k)}; expected ({B}, {H}, *, {D}) to match q "
                         f"(batch, heads, dim)")
    Tk = k.shape[2]
    if v.shape[0] != B or v.shape[1] != H or v.shape[2] != Tk:
        raise ValueError(f"v has shape {_shape(v)}; expected ({B}, {H}, {Tk}, *) to match k "
                         f"(batch, heads, time)")
    if same_length and Tq != Tk:
        raise ValueError(f"causal attention needs as many queries as keys; q has T={Tq}, k has T={Tk}")
    if Tk == 0 and Tq > 0 and not allow_no_keys:
        raise ValueError(f"k has shape {_shape(k)}: softmax over an empty set of keys is undefined; "
                         "expected at least one key")
    if D == 0:
        raise ValueError(f"q has shape {_shape(q)}; expected a head dimension of at least 1")
    return B, H, Tq, Tk, D, v.shape[3]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_state(name: str, state, *, q: torch.Tensor, shape: tuple[int, ...], layout: str) -> None:
    """A recurrent state ``[B, H, rows, cols]``: a tensor of ``shape``, on ``q``'s device, in the
    accumulation dtype of ``q`` (float32; float64 for float64 inputs) -- the dtype in which the
    ops return their final states, so that a returned state can be handed back as it is."""
    check_tensor(name, state, ndim=4, dtypes=None)
    acc = acc_dtype(q.dtype)
    if state.dtype != acc:
        raise TypeError(f"{name} has dtype {_dtype_name(state.dtype)}; expected {_dtype_name(acc)} (the state "
                        f"is accumulated in {_dtype_name(acc)} for {_dtype_name(q.dtype)} inputs)")
    if tuple(state.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(state.shape)}; expected {tuple(shape)} = {layout}")
    if state.device != q.device:
        raise ValueError(f"{name} is on {state.device}; expected {q.device} to match q")


def checks_values(x: torch.Tensor) -> bool:
    """Whether to check the *values* of ``x``: yes on the CPU (free), elsewhere only when the
    environment variable ``ATTNLIB_CHECK_VALUES`` is ``1`` (each check is a device-to-host sync)."""
    return x.device.type == "cpu" or os.environ.get("ATTNLIB_CHECK_VALUES", "0") == "1"


def check_positive(name: str, value, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number; got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def check_int(name: str, value, *, lo: int, hi: int | None = None, why: str = "") -> int:
    """An int (not a bool; a NumPy or torch integer scalar is accepted and returned as an int) in
    ``[lo, hi]`` (no upper bound when ``hi`` is None); ``why`` is appended to the range in the message."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_floating_point \
                and value.dtype != torch.bool:
            value = int(value)
        elif type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.dtype.kind in "iu":
            value = int(value)
        else:
            raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    if value < lo or (hi is not None and value > hi):
        span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {span}{why}; got {value}")
    return value


def check_bool(name: str, value) -> bool:
    """A bool, not merely something truthy (``return_weights="no"`` is a mistake, not a yes)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False); got {type(value).__name__} {value!r}")
    return value


# The chunk sizes the chunkwise references take (every op's kernel states its own, narrower range).
CHUNK_SIZES = (1, 4096)


def check_chunk_size(chunk_size) -> int:
    return check_power_of_two("chunk_size", chunk_size, lo=CHUNK_SIZES[0], hi=CHUNK_SIZES[1])


def check_power_of_two(name: str, value, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    if value < lo or value > hi or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{lo}, {hi}]; got {value}")
    return value
