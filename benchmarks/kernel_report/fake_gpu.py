"""A fake GPU per target: torch and Triton report the target's capability, name, SMs and shared memory,
and autograd can record a graph on fake CUDA tensors in a CPU-only torch."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import types
from pathlib import Path
from unittest import mock

import torch
from triton.backends.compiler import GPUTarget

from .targets import Target


class FakeDriver:
    """Stands in for ``triton.runtime.driver.active``: the target and its limits, and no device to run
    on (every launch is intercepted before Triton would ask for one)."""

    def __init__(self, target: Target):
        self.target = target
        self.utils = types.SimpleNamespace(get_device_properties=self.device_properties)

    def device_properties(self, device=0) -> dict:
        t = self.target
        return {"max_shared_mem": t.shared_memory, "max_num_regs": 65536, "multiprocessor_count": t.sms,
                "warpSize": 32, "sm_clock_rate": 0, "mem_clock_rate": 0, "mem_bus_width": 0}

    def get_current_target(self):
        return GPUTarget("cuda", self.target.sm, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cuda", 0)

    def is_active(self):
        return True


def _device_properties(target: Target):
    """What ``torch.cuda.get_device_properties`` would say about the target."""
    major, minor = target.capability
    return types.SimpleNamespace(
        name=target.gpu, major=major, minor=minor, total_memory=target.memory_gib << 30,
        multi_processor_count=target.sms, shared_memory_per_block=48 * 1024,
        shared_memory_per_block_optin=target.shared_memory, shared_memory_per_multiprocessor=target.shared_memory,
        max_threads_per_multi_processor=1024 if target.sm == 75 else 2048, regs_per_multiprocessor=65536,
        warp_size=32, L2_cache_size=0, is_integrated=False, is_multi_gpu_board=False, uuid="fake")


@functools.cache
def let_autograd_record_on_fake_cuda() -> None:
    """Register a device guard for CUDA in a CPU-only torch, so that autograd can record a graph on fake
    CUDA tensors (it asks the device's guard for the current stream of every input, and a CPU build has
    none for CUDA: "PyTorch is not linked with support for cuda devices"). The CPU guard stands in: it
    sets no device and has one stream, which is all a graph that never executes needs. The backward is
    then run by :func:`backward`, not by the C++ engine (which synchronises streams across devices).
    This writes into c10's guard registry, so it is done only in the capture subprocesses, and only
    where torch has no CUDA of its own."""
    if torch.backends.cuda.is_built():
        return
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    registry = (ctypes.c_void_p * 2).in_dll(lib, "_ZN3c104impl26device_guard_impl_registryE")
    cpu, cuda = 0, 1                                      # c10::DeviceType
    if registry[cuda] is None:
        registry[cuda] = registry[cpu]


@contextlib.contextmanager
def fake_gpu(target: Target):
    """Make torch and Triton report ``target`` as the one CUDA device: capability, name, properties
    (SMs, opt-in shared memory) and Triton's current target, so that attnlib's dispatch and tile choices
    and fla's import-time device detection see that GPU."""
    from triton.runtime import driver

    let_autograd_record_on_fake_cuda()
    props = _device_properties(target)
    patches = {"is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
               "get_device_capability": lambda device=None: target.capability,
               "get_device_properties": lambda device=None: props,
               "get_device_name": lambda device=None: target.gpu,
               "set_device": lambda device: None, "synchronize": lambda device=None: None,
               "_exchange_device": lambda device: 0, "_maybe_exchange_device": lambda device: 0,
               "is_initialized": lambda: True, "_lazy_init": lambda: None}
    previous = driver._active
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(torch.cuda, name, value, create=True))
        driver.set_active(FakeDriver(target))
        try:
            yield
        finally:
            driver._active = previous


@contextlib.contextmanager
def pointer_loads():
    """The wrappers' pointer path on every target: the fallback of the tensor-descriptor (TMA) loads on
    sm_90, taken for strides TMA cannot address or a Triton without host-side descriptors."""
    from attnlib.kernels.common import launch

    with mock.patch.object(launch, "tma_device", lambda device: False):
        yield
