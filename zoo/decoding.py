"""Incremental decoding: the capability a variant with a causal form offers for generation, and its helpers.

A :class:`Decoder` builds a state from a prompt (``prefill``) and advances it one token at a time (``step``),
each returning what the variant's causal forward returns at those positions. The state is a dict whose tensors
are the whole memory a sequence keeps between steps, so the harness counts it (:func:`counted_bytes`): a KV
cache grows by one token's worth per step, a recurrent state stays the same size, a sliding window's cache stops
growing at its window. ``growth`` declares which, and ``state_bytes`` may give the figure analytically; the
correctness suite checks both, and the inference suite times the steps against the decode a user would write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .contract import RegistrationError

if TYPE_CHECKING:
    import torch

GROWTHS = {
    "token": "grows by the same bytes with every token of context (a KV cache)",
    "window": "grows with every token until its window is full, then stays the same size",
    "fixed": "the same size at every context length (a recurrent state, or a cached fixed context)",
}
"""How a decoder's state grows with context, as :attr:`Decoder.growth` declares it."""


@dataclass(frozen=True)
class Decoder:
    """How a variant decodes token by token; set as :attr:`zoo.Variant.decoder`.

    ``prefill(module, query, key, value, key_mask=None) -> (output, state)``: the first p positions of a
    sequence (p may be 0: tensors of length 0), batch-first like the forward; ``output`` is what the causal
    forward gives at those positions. ``step(module, state, query, key, value, key_mask=None) -> (output,
    state)``: the next position (inputs of length 1), given the state the previous call returned; a state is
    consumed by the step that advances it (it may share storage with the one returned). ``key_mask``: (batch,
    length) booleans, False for a key nobody may attend to (padding); the decode then equals the causal forward
    under that key-padding mask, a query with no key to attend to giving what the forward gives (zeros for a
    core). ``state``: a dict of tensors (and plain numbers, e.g. the position reached); every tensor in it is
    state, counted at its live size (numel x element size: a view into a buffer with room to grow counts as the
    view; see :func:`append`).

    ``growth``: how the state grows with context, one of :data:`GROWTHS`. ``state_bytes(batch, context,
    d_model, num_heads, itemsize, **options)``, where given: the state's bytes after ``context`` tokens (a
    context decoder: with a context of that length, whatever it decoded) with no
    key masked, for inputs of ``itemsize`` bytes per element (the run's dtype; a state kept wider than its inputs,
e.g. a recurrent sum in float32 under bfloat16 inputs, says so: ``max(itemsize, 4)``), checked against the counted
bytes after every step.
    ``context``: a cross-attention decoder, whose keys and values are a fixed context given whole to ``prefill``
    (key_mask: its padding); steps then carry the next query only (key and value None) and the outputs equal the
    forward without ``is_causal`` (queries are independent of each other).
    """

    prefill: Callable[..., tuple[Any, dict]]
    step: Callable[..., tuple[Any, dict]]
    growth: str
    state_bytes: Callable[..., float] | None = None
    context: bool = False

    def validate(self, variant: str) -> None:
        """Refuse what the harness could not call or judge."""
        for attr in ("prefill", "step"):
            if not callable(getattr(self, attr)):
                raise RegistrationError(f"variant {variant!r}: decoder.{attr} must be callable")
        if self.growth not in GROWTHS:
            raise RegistrationError(f"variant {variant!r}: decoder.growth must be one of {', '.join(GROWTHS)}, "
                                    f"got {self.growth!r}")
        if self.state_bytes is not None and not callable(self.state_bytes):
            raise RegistrationError(f"variant {variant!r}: decoder.state_bytes must be callable (or None)")


def why_not(variant) -> str | None:
    """Why a variant does not decode (None when it does): what the capability table says."""
    if variant.decoder is not None:
        return None
    if not variant.tags.supports_causal:
        return "no causal form: the variant does not take is_causal, so there is nothing to decode token by token"
    return "the plugin offers no decoder (zoo.Variant.decoder)"


def counted_bytes(state: dict) -> int:
    """The bytes of every tensor in a decoder's state, at their live size."""
    import torch

    return sum(value.numel() * value.element_size() for value in state.values() if isinstance(value, torch.Tensor))


def allocated_bytes(state: dict) -> int:
    """The bytes of the storage behind the state's tensors (each storage once): what room to grow costs."""
    import torch

    storages = {}
    for value in state.values():
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def append(cache: "torch.Tensor | None", new: "torch.Tensor", dim: int) -> "torch.Tensor":
    """``cache`` extended by ``new`` along ``dim``, in amortised time proportional to ``new``: the result is a view
    of the live entries of a buffer with room to grow (its capacity doubles when full), so a step writes one token
    instead of copying the whole cache as ``torch.cat`` would. ``cache`` None (or empty) starts one. The ``cache``
    passed in is consumed: the result may share its storage."""
    dim = dim % new.dim()
    length = 0 if cache is None else cache.shape[dim]
    total = length + new.shape[dim]
    buffer = _buffer(cache, dim) if cache is not None else None
    if buffer is None or buffer.shape[dim] < total:
        shape = list(new.shape)
        shape[dim] = max(16, 2 * total)
        grown = new.new_empty(shape)
        if length:
            grown.narrow(dim, 0, length).copy_(cache)
        buffer = grown
    buffer.narrow(dim, length, new.shape[dim]).copy_(new)
    return buffer.narrow(dim, 0, total)


def _buffer(cache: "torch.Tensor", dim: int) -> "torch.Tensor | None":
    """The whole buffer ``cache`` is the leading part of along ``dim``, where :func:`append` made it (a narrow, from
    the start, of a contiguous buffer); None for any other tensor (it is then copied into a new buffer)."""
    inner = 1
    for size in cache.shape[dim + 1:]:
        inner *= size
    elements = cache.untyped_storage().nbytes() // cache.element_size()
    capacity = (cache.stride(dim - 1) if dim else elements) // max(inner, 1)
    shape = list(cache.shape)
    shape[dim] = capacity
    strides, step = [0] * len(shape), 1
    for index in range(len(shape) - 1, -1, -1):
        strides[index], step = step, step * shape[index]
    if cache.storage_offset() != 0 or list(cache.stride()) != strides or step > elements or capacity < cache.shape[dim]:
        return None
    return cache.as_strided(shape, strides, 0)


def decode(decoder: Decoder, module, query, key, value, key_mask=None, prefill: int = 0, on_state=None):
    """The decoder run over a whole sequence: a prefill of the first ``prefill`` positions, then one step per
    position; the outputs concatenated along the sequence (what the forward would return) and the final state.
    ``on_state(state)`` sees the state after the prefill and after every step. For a ``context`` decoder, key,
    value and key_mask are the fixed context and only the queries are split."""
    import torch

    n = query.shape[1]
    if decoder.context:
        output, state = decoder.prefill(module, query[:, :prefill], key, value, key_mask)
    else:
        output, state = decoder.prefill(module, query[:, :prefill], key[:, :prefill], value[:, :prefill],
                                        None if key_mask is None else key_mask[:, :prefill])
    _expect_state(state, "prefill")
    outputs = [_expect_output(output, query, prefill, "prefill")]
    if on_state is not None:
        on_state(state)
    for position in range(prefill, n):
        token = slice(position, position + 1)
        if decoder.context:
            output, state = decoder.step(module, state, query[:, token], None, None, None)
        else:
            output, state = decoder.step(module, state, query[:, token], key[:, token], value[:, token],
                                         None if key_mask is None else key_mask[:, token])
        _expect_state(state, f"step at position {position}")
        outputs.append(_expect_output(output, query, 1, f"step at position {position}"))
        if on_state is not None:
            on_state(state)
    return torch.cat(outputs, dim=1), state


def _expect_state(state, where: str) -> None:
    if not isinstance(state, dict):
        from .contract import VariantOutputError

        raise VariantOutputError(f"the decoder's {where} returned a state of type {type(state).__name__}, not a dict "
                                 "of tensors")


def _expect_output(output, query, length: int, where: str):
    import torch

    from .contract import VariantOutputError

    expected = (query.shape[0], length)
    if not isinstance(output, torch.Tensor) or tuple(output.shape[:2]) != expected:
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise VariantOutputError(f"the decoder's {where} returned output {shape}, expected (batch, {length}, ...) = "
                                 f"{expected}")
    return output
