"""The Python API: list and build variants as drop-in layers (the CLI is a thin layer on this)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from .contract import OptionError, Tags, Variant, VariantInputError, VariantOutputError
from .registry import Registry, load_registry


@functools.lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The registry with the default load order, built on first use (the API's convenience)."""
    return load_registry()


def list_variants(pattern: str | Iterable[str] | None = None, registry: Registry | None = None) -> list[str]:
    """Names of registered variants, filtered by wildcard pattern(s) such as ``"*attention*"``."""
    return (registry or default_registry()).list_variants(pattern)


def create(name: str, d_model: int, num_heads: int = 1, *, registry: Registry | None = None, **options: Any):
    """Build variant ``name`` as an ``nn.Module``; unknown options are rejected by name."""
    variant = (registry or default_registry()).variant(name)
    return build(variant, d_model=d_model, num_heads=num_heads, **options)


def build(variant: Variant, d_model: int, num_heads: int = 1, **options: Any):
    """Build a module from a :class:`Variant`, validating sizes and options, with input checks attached."""
    for label, value in (("d_model", d_model), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise OptionError(f"variant {variant.name!r}: {label} must be a positive integer, got {value!r}")
    if d_model % num_heads:
        raise OptionError(
            f"variant {variant.name!r}: d_model={d_model} is not divisible by num_heads={num_heads}"
        )
    resolved = variant.resolve_options(options)
    try:
        module = variant.factory(d_model=d_model, num_heads=num_heads, **resolved)
    except (ValueError, TypeError) as exc:
        raise OptionError(f"variant {variant.name!r} rejected its options {resolved}: {exc}") from exc
    identity = _Identity(variant.name, variant.tags)  # not the variant: the hooks must pickle with the module
    module.register_forward_pre_hook(
        functools.partial(_check_inputs, identity, d_model, num_heads, resolved), with_kwargs=True
    )
    module.register_forward_hook(functools.partial(_check_output, identity, d_model), with_kwargs=True)
    return module


@dataclass(frozen=True)
class _Identity:
    """What the input and output checks need of a variant: plain data, so modules pickle."""

    name: str
    tags: Tags


def _check_inputs(variant: _Identity, d_model: int, num_heads: int, options: dict, module, args, kwargs):
    """Reject inputs outside the variant's declared capabilities with an error naming both."""
    names = ("query", "key", "value", "attn_mask", "is_causal")
    bound = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise VariantInputError(f"variant {variant.name!r}: unexpected argument {key!r}")
        bound[key] = value
    missing = [n for n in names[:3] if n not in bound]
    if missing:
        raise VariantInputError(f"variant {variant.name!r}: missing {', '.join(missing)}")
    query, key, value = bound["query"], bound["key"], bound["value"]
    attn_mask, is_causal = bound.get("attn_mask"), bool(bound.get("is_causal", False))
    tags = variant.tags

    def fail(message: str):
        raise VariantInputError(f"variant {variant.name!r}: {message}")

    for label, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            fail(f"{label} must be a tensor, got {type(tensor).__name__}")
        if tensor.dim() != 3:
            fail(f"{label} must be a (batch, seq, dim) tensor, got shape {tuple(tensor.shape)}")
        if not tensor.is_floating_point():
            fail(f"{label} must be a floating-point tensor, got {tensor.dtype}")
    if not query.dtype == key.dtype == value.dtype:
        fail(f"query, key and value must have one dtype, got {query.dtype}, {key.dtype} and {value.dtype}")
    if not query.device == key.device == value.device:
        fail(f"query, key and value must be on one device, got {query.device}, {key.device} and {value.device}")
    for name, held in (*module.named_parameters(), *module.named_buffers()):  # a buffer may keep its own precision
        if held.device != query.device:
            fail(f"the inputs are on {query.device} but the module's {name} is on {held.device} (move one to the other)")
    for name, held in module.named_parameters():
        if held.is_floating_point() and held.dtype != query.dtype:
            fail(f"the inputs are {query.dtype} but the module's {name} is {held.dtype} (convert one to the other)")
    if not query.shape[0] == key.shape[0] == value.shape[0]:
        fail(f"batch sizes differ: query {query.shape[0]}, key {key.shape[0]}, value {value.shape[0]}")
    if key.shape[1] != value.shape[1]:
        fail(f"key and value lengths differ: {key.shape[1]} vs {value.shape[1]}")
    if query.shape[-1] != d_model:
        fail(f"query feature size {query.shape[-1]} != d_model {d_model}")
    expected_k = options.get("kdim") or d_model if tags.allows_kv_dims else d_model
    expected_v = options.get("vdim") or d_model if tags.allows_kv_dims else d_model
    if key.shape[-1] != expected_k or value.shape[-1] != expected_v:
        capability = "" if tags.allows_kv_dims else " (capability allows_kv_dims is False)"
        fail(f"key/value feature sizes {key.shape[-1]}/{value.shape[-1]} != expected "
             f"{expected_k}/{expected_v}{capability}")
    if query.shape[1] != key.shape[1] and not tags.allows_different_lengths:
        fail(f"q_len {query.shape[1]} != k_len {key.shape[1]} (capability allows_different_lengths is False)")
    if is_causal and not tags.supports_causal:
        fail("is_causal=True is not supported (capability supports_causal is False)")
    if not is_causal and tags.causal_only:
        fail("is_causal=False is not supported (capability causal_only: the variant computes only its causal form)")
    if attn_mask is not None:
        if not tags.accepts_attn_mask:
            fail("attn_mask is not supported (capability accepts_attn_mask is False)")
        if getattr(attn_mask, "dtype", None) is not torch.bool:
            fail(f"attn_mask must be a boolean tensor (True = may attend), got {getattr(attn_mask, 'dtype', type(attn_mask))}")
        if attn_mask.device != query.device:
            fail(f"attn_mask must be on the inputs' device {query.device}, got {attn_mask.device}")
        target = (query.shape[0], num_heads, query.shape[1], key.shape[1])
        if attn_mask.dim() > 4 or not _broadcastable(tuple(attn_mask.shape), target):
            fail(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (batch, heads, q_len, k_len) = {target}")
        if attn_mask.dim() < 2:  # (k_len,) or a scalar: broadcast as torch SDPA does; variants see 2-D or more
            bound["attn_mask"] = attn_mask.reshape((1,) * (2 - attn_mask.dim()) + tuple(attn_mask.shape))
            return (), bound


def _check_output(variant: _Identity, d_model: int, module, args, kwargs, output):
    """Shape, dtype and device of what the variant returned (metadata only: no cost in timed loops)."""
    query = args[0] if args else kwargs["query"]
    key = args[1] if len(args) > 1 else kwargs["key"]
    expected = (query.shape[0], query.shape[1], d_model)
    if not isinstance(output, torch.Tensor):
        raise VariantOutputError(f"variant {variant.name!r} returned {type(output).__name__}, not a tensor")
    if tuple(output.shape) != expected:
        raise VariantOutputError(
            f"variant {variant.name!r} returned shape {tuple(output.shape)} for query {tuple(query.shape)} and key "
            f"{tuple(key.shape)}; expected (batch, q_len, d_model) = {expected}")
    if output.dtype != query.dtype or output.device != query.device:
        raise VariantOutputError(
            f"variant {variant.name!r} returned {output.dtype} on {output.device} for {query.dtype} inputs on "
            f"{query.device}; dtype and device must be preserved")


def _broadcastable(shape: tuple, target: tuple) -> bool:
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))
