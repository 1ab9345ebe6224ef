"""Incremental decoding: the capability a variant with a causal form offers for generation, and its helpers.

A :class:`Decoder` builds a state from a prompt (``prefill``) and advances it one token at a time (``step``),
each returning what the variant's causal forward returns at those positions. The state is a dict whose tensors
are the whole memory a sequence keeps between steps, so the harness counts it (:func:`counted_bytes`): a KV
cache grows by one token's worth per step, a recurrent state stays the same size, a sliding window's cache stops
growing at its window. ``growth`` declares which, and ``state_bytes`` may give the figure analytically; the
correctness suite checks both, and the inference suite times the steps against the decode a user would write and
against the plugin's own other decodes of the same function (``baselines``: MLA's explicit form beside its
absorbed one, say).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .contract import RegistrationError

if TYPE_CHECKING:
    import torch

STANDARD_DECODES = {"core": "sdpa-kv-cache", "layer": "mha-kv-cache"}
"""The decode each kind of variant is timed against (what a user would write for the same shapes), by the labels
its rows carry in ``versus``: no decoder baseline may take one."""

GROWTHS = {
    "token": "grows with the context without bound, by a token's worth per step (a KV cache) or by whole blocks "
             "in a repeating pattern (a cache that compresses complete blocks)",
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
    consumed by the step that advances it (the step may update it in place or share its storage with the one it
    returns: a decode that branches, for beam search, clones the state first). ``key_mask``: (batch,
    length) booleans, False for a key nobody may attend to (padding); the decode then equals the causal forward
    under that key-padding mask, a query with no key to attend to giving what the forward gives (zeros for a
    core). ``state``: a dict of tensors (and plain numbers, e.g. the position reached); every tensor in it is
    state, counted at its live size (numel x element size: a view into a buffer with room to grow counts as the
    view; see :func:`append`).

    ``growth``: how the state grows with context, one of :data:`GROWTHS`. ``state_bytes(batch, context,
    d_model, num_heads, itemsize, **options)``, where given: the state's bytes after ``context`` tokens (a context
    decoder: with a context of that length, whatever it decoded) with no key masked, for inputs of ``itemsize``
    bytes per element (the run's dtype; a state kept wider than its inputs, e.g. a recurrent sum in float32 under
    bfloat16 inputs, says so: ``max(itemsize, 4)``); the correctness suite checks it against the counted bytes
    after every step in float64 and float32.
    ``context``: a cross-attention decoder, whose keys and values are a fixed context given whole to ``prefill``
    (key_mask: its padding); steps then carry the next query only (key and value None) and the outputs equal the
    forward without ``is_causal`` (queries are independent of each other).
    ``baselines``: other decoders of the same function, by label (e.g. ``{"explicit-latent": Decoder(...)}``):
    the correctness suite checks each against the forward as it checks this one, and the inference suite times
    their steps in turns with this one's and the standard decode's, giving this decode's ratio to each (a target
    can then ask ``Target("decode-ratio", versus=label, ...)``). Their states are not counted or judged.
    """

    prefill: Callable[..., tuple[Any, dict]]
    step: Callable[..., tuple[Any, dict]]
    growth: str
    state_bytes: Callable[..., float] | None = None
    context: bool = False
    baselines: Mapping[str, "Decoder"] = field(default_factory=dict, hash=False)

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
        if not isinstance(self.baselines, Mapping):
            raise RegistrationError(f"variant {variant!r}: decoder.baselines must be a dict of label -> Decoder, got "
                                    f"{type(self.baselines).__name__}")
        for label, other in self.baselines.items():
            if not isinstance(label, str) or not label.strip():
                raise RegistrationError(f"variant {variant!r}: decoder.baselines label {label!r} must be a non-empty "
                                        "string")
            if label == variant or label in STANDARD_DECODES.values():
                raise RegistrationError(f"variant {variant!r}: decoder.baselines label {label!r} is taken (the "
                                        "variant's own name and the standard decodes' labels, "
                                        f"{', '.join(STANDARD_DECODES.values())}, name their rows)")
            if not isinstance(other, Decoder) or other.baselines:
                raise RegistrationError(f"variant {variant!r}: decoder.baselines[{label!r}] must be a zoo.Decoder "
                                        "without baselines of its own")
            if other.context != self.context:
                raise RegistrationError(f"variant {variant!r}: decoder.baselines[{label!r}] must decode as the "
                                        f"variant's decoder does (context={self.context})")
            other.validate(variant)


def why_not(variant) -> str | None:
    """Why a variant does not decode (None when it does): what the capability table says."""
    if variant.decoder is not None:
        return None
    if not variant.tags.supports_causal:
        return "no causal form: the variant does not take is_causal, so there is nothing to decode token by token"
    return "the plugin offers no decoder (zoo.Variant.decoder)"


def refuse_key_mask(variant: str, key_mask) -> None:
    """A decoder of a variant without masks refuses a key mask rather than ignore it, as the API refuses an
    attn_mask."""
    if key_mask is not None:
        raise ValueError(f"{variant} takes no key_mask (capability accepts_attn_mask is False)")


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


GROWTH_FACTOR = 1.25
"""How much room :func:`append` leaves when it (re)allocates: a quarter more than the live entries (at least
:data:`MIN_CAPACITY`), so a cache holds at most 1.25x its counted bytes and a step still costs amortised O(1)."""
MIN_CAPACITY = 8
_BUFFERS: dict[int, "weakref.ref"] = {}  # the buffers append made, by the address of their storage


def append(cache: "torch.Tensor | None", new: "torch.Tensor", dim: int) -> "torch.Tensor":
    """``cache`` extended by ``new`` along ``dim``, in amortised time proportional to ``new``: the result is a view
    of the live entries of a buffer with room to grow (a quarter more than it holds, see :data:`GROWTH_FACTOR`),
    so a step writes one token instead of copying the whole cache as ``torch.cat`` would. ``cache`` None starts one;
    a tensor append did not make (a slice of the caller's own, say) is copied, never written into. The ``cache``
    passed in is consumed: the result may share its storage, so append to it once (a step that would branch a
    decode, for beam search, clones the state first)."""
    dim = dim % new.dim()
    if cache is not None and (cache.dtype != new.dtype or cache.device != new.device or cache.dim() != new.dim()
                              or any(a != b for i, (a, b) in enumerate(zip(cache.shape, new.shape)) if i != dim)):
        raise ValueError(f"append: a {new.dtype} {tuple(new.shape)} tensor on {new.device} does not extend a "
                         f"{cache.dtype} {tuple(cache.shape)} cache on {cache.device} along dim {dim}")
    length = 0 if cache is None else cache.shape[dim]
    total = length + new.shape[dim]
    buffer = _buffer(cache, dim) if cache is not None else None
    if buffer is None or buffer.shape[dim] < total:
        shape = list(new.shape)
        shape[dim] = max(MIN_CAPACITY, int(total * GROWTH_FACTOR))
        grown = new.new_empty(shape)
        if length:
            grown.narrow(dim, 0, length).copy_(cache)
        buffer = grown
        _remember(buffer)
    buffer.narrow(dim, length, new.shape[dim]).copy_(new)
    return buffer.narrow(dim, 0, total)


def window_cache(recent: "torch.Tensor", window: int, dim: int) -> "torch.Tensor":
    """The last ``window`` entries of ``recent`` along ``dim`` as a ring, position t in slot t % window (a buffer
    :func:`append` made, so it can grow until the window is full): a step then overwrites the oldest in place
    (:func:`push_window`). For softmax over the window, where a key sits in the cache does not matter."""
    import torch

    kept = max(0, recent.shape[dim] - window)
    return append(None, torch.roll(recent.narrow(dim, kept, recent.shape[dim] - kept), kept % window, dims=dim), dim)


def push_window(cache: "torch.Tensor", new: "torch.Tensor", position: int, window: int, dim: int) -> "torch.Tensor":
    """``cache`` (from :func:`window_cache`) with the entry of ``position`` (``new``, length 1 along ``dim``):
    appended while the window is not full, else written over the oldest, in slot position % window."""
    if cache.shape[dim] < window:
        return append(cache, new, dim)
    cache.narrow(dim, position % window, 1).copy_(new)
    return cache


def _remember(buffer: "torch.Tensor") -> None:
    """Record a buffer append made (forgotten when it is freed)."""
    address = buffer.untyped_storage().data_ptr()
    reference = weakref.ref(buffer, lambda dead: _BUFFERS.get(address) is dead and _BUFFERS.pop(address, None))
    _BUFFERS[address] = reference


def _buffer(cache: "torch.Tensor", dim: int) -> "torch.Tensor | None":
    """The buffer :func:`append` made that ``cache`` is the leading part of along ``dim``; None for any other tensor."""
    reference = _BUFFERS.get(cache.untyped_storage().data_ptr())
    buffer = reference() if reference is not None else None
    if (buffer is None or cache.storage_offset() != 0 or cache.stride() != buffer.stride()
            or any(a != b for i, (a, b) in enumerate(zip(cache.shape, buffer.shape)) if i != dim)):
        return None
    return buffer


def decode(decoder: Decoder, module, query, key, value, key_mask=None, prefill: int = 0, on_state=None):
    """The decoder run over a whole sequence: a prefill of the first ``prefill`` positions, then one step per
    position, each given tensors of its own (copies: a decoder that kept a view of its prompt and wrote past it
    fails instead of reading the next token there); the outputs concatenated along the sequence (what the forward
    would return) and the final state.
    ``on_state(state)`` sees the state after the prefill and after every step. For a ``context`` decoder, key,
    value and key_mask are the fixed context and only the queries are split."""
    import torch

    n = query.shape[1]

    def part(x, where):
        return None if x is None else x[:, where].clone()

    if decoder.context:
        output, state = decoder.prefill(module, part(query, slice(0, prefill)), key.clone(), value.clone(),
                                        part(key_mask, slice(None)))
    else:
        output, state = decoder.prefill(module, *(part(x, slice(0, prefill)) for x in (query, key, value, key_mask)))
    _expect_state(state, "prefill")
    outputs = [_expect_output(output, query, prefill, "prefill")]
    if on_state is not None:
        on_state(state)
    for position in range(prefill, n):
        token = slice(position, position + 1)
        if decoder.context:
            output, state = decoder.step(module, state, part(query, token), None, None, None)
        else:
            output, state = decoder.step(module, state, *(part(x, token) for x in (query, key, value, key_mask)))
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
