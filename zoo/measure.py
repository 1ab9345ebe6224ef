"""Deterministic measurements: FLOPs (torch's formulas) and peak live tensor memory, in one dispatch mode.

Both are noise-free, so complexity verdicts rest on them; time is measured in the speed suite.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import (
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


class Counters(TorchDispatchMode):
    """FLOPs and peak live tensor memory of the ops run inside it, in one pass of one dispatch mode.

    FLOPs are torch's: the formulas of ``torch.utils.flop_counter.flop_registry`` (with the fused CPU attention
    formulas above), an op first decomposed where torch's ``FlopCounterMode`` would decompose it, so the totals
    equal ``FlopCounterMode``'s (a test holds them to it on every built-in). It is leaner per op than
    ``FlopCounterMode`` and a second mode for memory: a counted call runs every op through Python, and a
    token-by-token recurrence makes tens of thousands of ops (Gated DeltaNet's at n=256: 23,000), and the two
    modes took 2.2 s over its 0.2 s call where this one takes 1.0 s.

    Memory: every storage created inside it is tracked until it dies, and the peak of their total size is kept.
    Tensors that existed before entering (inputs, parameters) are not counted, so the figure is the call's own
    activations and temporaries (and, with backward, the gradients it produces). A view (or in-place result)
    shares its input's storage: it allocates nothing, and counting it would charge a call for a slice of a
    parameter or an input it was given.

    Ops: how many ops reached it (``dispatched``), each costing the framework's per-op overhead whatever its size:
    what a Python loop over tokens pays per token, which counted FLOPs do not see. With ``max_ops``, the op after
    that many raises :class:`TooManyOps`, and with ``max_bytes`` the op that takes the live tensors past that many
    bytes raises :class:`TooMuchMemory`: a call known to be over a cap is not run to its end.
    """

    supports_higher_order_operators = True  # as FlopCounterMode: such an op is left to its own implementation
    _DECOMPOSES: dict = {}  # op overload -> whether FlopCounterMode would decompose it (fixed per op)

    def __init__(self, flops: bool = True, memory: bool = True, max_ops: float | None = None,
                 max_bytes: float | None = None) -> None:
        super().__init__()
        self.counting_flops, self.tracking_memory, self.max_ops, self.max_bytes = flops, memory, max_ops, max_bytes
        self.flops_by_op: dict = {}
        self.dispatched = 0
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    @property
    def flops(self) -> int:
        """FLOPs of every op counted so far."""
        return sum(self.flops_by_op.values())

    def ops(self) -> list[str]:
        """The names of the ops that have a FLOP formula and ran (which SDPA backend ran, for instance)."""
        return sorted(str(op) for op in self.flops_by_op)

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, size = storage._cdata, storage.nbytes()
        if size == 0 or key in self.live:
            return
        self.live[key] = size, weakref.ref(storage, lambda _, key=key: self._release(key))  # cheaper than finalize
        self.current += size
        self.peak = max(self.peak, self.current)
        if self.max_bytes is not None and self.peak > self.max_bytes:
            raise TooMuchMemory(self.max_bytes)

    def _release(self, key: int) -> None:
        size, _ = self.live.pop(key, (0, None))
        self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA_OPS:
            return NotImplemented  # as FlopCounterMode: such ops reach a mode only for tensor subclasses
        if isinstance(func, torch._ops.HigherOrderOperator):
            return NotImplemented
        if func is not torch.ops.prim.device.default:  # a fake tensor's device query; a real call makes none
            self.dispatched += 1
        if self.max_ops is not None and self.dispatched > self.max_ops:
            raise TooManyOps(self.max_ops)
        packet = func._overloadpacket
        if self.counting_flops and packet not in flop_registry and func is not torch.ops.prim.device.default:
            decomposes = self._DECOMPOSES.get(func)
            if decomposes is None:
                decomposes = self._DECOMPOSES[func] = _decomposes(func)
            if decomposes:
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        out = func(*args, **kwargs)
        if self.counting_flops and packet in flop_registry:
            self.flops_by_op[packet] = self.flops_by_op.get(packet, 0) + flop_registry[packet](
                *args, **kwargs, out_val=out)
        if self.tracking_memory and not _ALIASES.setdefault(func, any(
                ret.alias_info is not None for ret in func._schema.returns)):  # a view, in place or out=: its input's
            given = None
            for leaf in _tensors(out):
                if leaf.device.type == "meta":
                    continue
                pointer = leaf.untyped_storage()._cdata  # the storage itself: a fake tensor's has no address
                if pointer in self.live:
                    continue
                if given is None:
                    given = {t.untyped_storage()._cdata for t in _tensors((args, kwargs))
                             if t.device.type != "meta"}
                if pointer not in given:
                    self._track(leaf)
        return out


class OverCap(Exception):
    """A counted call went past a cap (:class:`Counters`); it was stopped there."""


class TooManyOps(OverCap):
    """A counted call dispatched more ops than its ``max_ops``."""

    def __init__(self, max_ops: float) -> None:
        super().__init__(f"over {max_ops:g} ops dispatched in one call")
        self.max_ops = max_ops


class TooMuchMemory(OverCap):
    """A counted call's live tensors took more bytes than its ``max_bytes``."""

    def __init__(self, max_bytes: float) -> None:
        super().__init__(f"over {max_bytes / 2 ** 30:.3g} GiB of tensors live at once in one call")
        self.max_bytes = max_bytes


_ALIASES: dict = {}
"""Op overload -> whether its schema says a result is (a view of) one of its inputs: an op that allocates nothing.
A fake tensor (:func:`counts_on_fake_tensors`) made from a real input has a storage of its own, so that a view of
it is not taken for new memory."""

_METADATA_OPS = frozenset({
    aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
    aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
    aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
    torch.ops.prim.layout.default})


def _decomposes(func) -> bool:
    """Whether ``func.decompose`` would run a decomposition (rather than return NotImplemented)."""
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    return key in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)


def _tensors(tree):
    """The tensors in an op's arguments or outputs: tensors, lists and tuples of them (nested), dict values."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


def count_flops(fn: Callable[[], object], with_ops: bool = False):
    """FLOPs of one call of ``fn`` (matmul-like ops, including the fused attention kernels); with
    ``with_ops``, also the names of the counted ops (which SDPA backend ran, for instance)."""
    with Counters(memory=False) as counter:
        fn()
    return (counter.flops, counter.ops()) if with_ops else counter.flops


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of tensor storage alive during one call of ``fn`` (deterministic, device-agnostic)."""
    with Counters(flops=False) as counter:
        fn()
    return counter.peak


def counts_on_fake_tensors(fn: Callable[[], object]) -> tuple[int, int, int] | None:
    """:func:`call_counts` of one call of ``fn`` on CPU, run on fake tensors (torch's ``FakeTensorMode``: each op
    makes its result's shape, dtype and strides, and no values), so a call costs its dispatch and no arithmetic:
    the same ops make the same tensors, so the counts are a real call's (a test holds every built-in to that). The
    tensors ``fn`` closes over become fake as it uses them. None where the call needs a value (``.item()``, a shape
    that depends on the data) or fails: then count a fresh call on real tensors, since this one may have left fake
    tensors in what it keeps (a cache, a gradient). Which is cheaper: :func:`cheaper_on_fake_tensors`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return call_counts(fn)
    except Exception:  # the real call says what is wrong, if anything is
        return None


FAKE_SECONDS_PER_OP = 5e-4
"""About what an op costs on fake tensors under the counters here (2-core AMD EPYC, one thread): a chunked additive
attention's forward+backward, 2,652 ops, took 1.1-1.7 s counted so at n = 1024 to 4096 (0.7-0.9 s on fake tensors
alone); a call's first fake ops cost more (making its inputs and weights fake)."""


def cheaper_on_fake_tensors(counted: list[tuple[int, float, int]], n: int) -> bool:
    """Whether a call at length ``n`` is predicted to cost less counted on fake tensors than on real ones, from its
    real counted calls at shorter lengths (``counted``: (length, seconds, ops) each): the seconds and the ops each
    extrapolated along the log-log line through the last two (from one: both in proportion to the length), a fake
    op at :data:`FAKE_SECONDS_PER_OP`. Additive attention's arithmetic grows with the square of the length while its
    ops do not (faked at every length from 1024, its counts took 26 s of a profiled quick complexity job, more than
    the real calls they replaced below 4096); a loop over tokens or chunks dispatches thousands of cheap ops, dearer
    faked. Only the cost depends on the choice, never the counts."""
    if not counted:
        return False

    def at_n(points):
        (n0, v0), (n1, v1) = points[0], points[-1]
        slope = 1.0 if n0 == n1 or v0 <= 0 or v1 <= 0 else max(math.log(v1 / v0) / math.log(n1 / n0), 0.0)
        return v1 * (n / n1) ** slope

    last = counted[-2:]
    return at_n([(m, s) for m, s, _ in last]) > FAKE_SECONDS_PER_OP * at_n([(m, o) for m, _, o in last])


def call_counts(fn: Callable[[], object], max_ops: float | None = None,
                max_bytes: float | None = None) -> tuple[int, int, int]:
    """FLOPs, peak live tensor bytes and ops dispatched of one call of ``fn``, in one pass (:class:`TooManyOps` once
    it dispatches more than ``max_ops``, :class:`TooMuchMemory` once its live tensors take more than ``max_bytes``)."""
    with Counters(max_ops=max_ops, max_bytes=max_bytes) as counter:
        fn()
    return counter.flops, counter.peak, counter.dispatched


class BytesRead(TorchDispatchMode):
    """The bytes of the tensors every op inside it reads, each distinct tensor (storage, offset, shape and strides)
    at most once in all: what a call must bring from memory if nothing were cached. A view op reads nothing (it
    only describes memory), so a slice of a large buffer counts as the slice where an op reads it; a gather
    (advanced indexing, ``index_select``, ``gather``, ``embedding``) reads the elements it selects, its output's
    size, not the whole tensor it selects from (Native Sparse Attention's decode step gathers a few blocks of its
    cache: counted whole, its step read 148% of the machine's bandwidth)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple] = set()
        self.counted: dict[tuple, int] = {}  # elements of each tensor counted so far, at most all of it
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            return func(*args, **(kwargs or {}))
        source = args[_GATHERS[func]] if func in _GATHERS else None
        for leaf in tree_leaves((args, kwargs)):
            if leaf is not source:
                self._read(leaf)
        out = func(*args, **(kwargs or {}))
        if source is not None:  # the selected elements: as many as the output holds
            self._read(source, out.numel(), gathered=tuple(_key(t) for t in tree_leaves((args, kwargs))
                                                           if isinstance(t, torch.Tensor)))
        return out

    def _read(self, tensor, elements: int | None = None, gathered: tuple = ()) -> None:
        """``elements`` of ``tensor`` read (None: all of it), once per gather (or plain read) of it."""
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" and tensor.numel():
            memory = _key(tensor)
            if (memory, gathered) not in self.seen:
                self.seen.add((memory, gathered))
                before = self.counted.get(memory, 0)
                whole = tensor.numel()
                self.counted[memory] = whole if elements is None else min(whole, before + elements)
                self.total += (self.counted[memory] - before) * tensor.element_size()


_GATHERS = {aten.index.Tensor: 0, aten.index_select.default: 0, aten.gather.default: 0, aten.embedding.default: 0}
"""Gather ops, and the position of the tensor each selects from."""


def _key(tensor: torch.Tensor) -> tuple:
    """A tensor as the memory it covers: storage, offset, shape and strides."""
    return tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride()


def bytes_read(fn: Callable[[], object]) -> int:
    """Bytes one call of ``fn`` reads (see :class:`BytesRead`; deterministic, device-agnostic)."""
    with BytesRead() as counter:
        fn()
    return counter.total
