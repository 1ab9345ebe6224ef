"""Deterministic measurements: FLOPs (FlopCounterMode) and peak live tensor memory (a dispatch mode).

Both are noise-free, so complexity verdicts rest on them; time is measured in the speed suite.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

aten = torch.ops.aten

# torch counts its fused CPU attention kernels as zero FLOPs (no formula registered for them); give them
# the same formulas as the CUDA flash kernels. Dense: a causal call is counted as the full n^2, as torch does.
_CPU_FORWARD = aten._scaled_dot_product_flash_attention_for_cpu
_CPU_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward

if _CPU_FORWARD not in flop_registry:

    @register_flop_formula(_CPU_FORWARD)
    def _cpu_flash_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)


if _CPU_BACKWARD not in flop_registry:

    @register_flop_formula(_CPU_BACKWARD)
    def _cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                            **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def count_flops(fn: Callable[[], object], with_ops: bool = False):
    """FLOPs of one call of ``fn`` (matmul-like ops, including the fused attention kernels); with
    ``with_ops``, also the names of the counted ops (which SDPA backend ran, for instance)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    total = counter.get_total_flops()
    if not with_ops:
        return total
    return total, sorted(str(op) for op in counter.get_flop_counts().get("Global", {}))


class PeakMemory(TorchDispatchMode):
    """Tracks every storage created inside it until it dies, and the peak of their total size.

    Tensors that existed before entering (inputs, parameters) are not counted, so the figure is the
    call's own activations and temporaries (and, with backward, the gradients it produces).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self.live:
            return
        self.live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a view (or in-place result) shares its input's storage: it allocates nothing, and counting it would
        # charge a call for a slice of a parameter or an input it was given
        given = {leaf.untyped_storage().data_ptr() for leaf in tree_leaves((args, kwargs))
                 if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta"}
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta" \
                    and leaf.untyped_storage().data_ptr() not in given:
                self._track(leaf)
        return out


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of tensor storage alive during one call of ``fn`` (deterministic, device-agnostic)."""
    with PeakMemory() as tracker:
        fn()
    return tracker.peak


def flops_and_peak_memory(fn: Callable[[], object]) -> tuple[int, int]:
    """:func:`count_flops` and :func:`peak_memory` of one call of ``fn``, both counters in the same pass: a
    counted call runs every op through Python, so counting twice costs a second such call."""
    with FlopCounterMode(display=False) as counter, PeakMemory() as tracker:
        fn()
    return counter.get_total_flops(), tracker.peak


class BytesRead(TorchDispatchMode):
    """The bytes of the tensors every op inside it reads, each distinct tensor (storage, offset, shape and strides)
    once: what a call must bring from memory if nothing were cached. A view op reads nothing (it only describes
    memory), so a slice of a large buffer counts as the slice where an op reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple] = set()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            for leaf in tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta" and leaf.numel():
                    key = (leaf.untyped_storage().data_ptr(), leaf.storage_offset(), tuple(leaf.shape), leaf.stride())
                    if key not in self.seen:
                        self.seen.add(key)
                        self.total += leaf.numel() * leaf.element_size()
        return func(*args, **(kwargs or {}))


def bytes_read(fn: Callable[[], object]) -> int:
    """Bytes one call of ``fn`` reads (see :class:`BytesRead`; deterministic, device-agnostic)."""
    with BytesRead() as counter:
        fn()
    return counter.total
