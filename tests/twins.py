"""Plain softmax attention and the faulty twins more than one test file needs: each twin breaks one property, so
the check for that property, and only it, must catch it. Plugin files that tests write import them from here
(``conftest.run_python`` puts this folder on the path of every process it starts)."""

import torch
from torch import nn

from zoo.functional import masked_sdpa, merge_heads, split_heads
from zoo.reference import reference_mask, softmax_attention


class Attention(nn.Module):
    """Plain multi-head-split SDPA; subclasses break one property each."""

    def __init__(self, d_model, num_heads=1):
        super().__init__()
        self.num_heads = num_heads

    def heads(self, query, key, value):
        return (split_heads(x, self.num_heads) for x in (query, key, value))

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        return merge_heads(masked_sdpa(*self.heads(query, key, value), attn_mask, is_causal))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """Softmax attention per head in float64, written apart from the module."""
    h = module.num_heads
    heads = [x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value)]
    return softmax_attention(*heads, reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])).transpose(1, 2).flatten(2)


class ReturnsFloat64(Attention):
    """Its output in float64 whatever the inputs' dtype."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs).double()


class MeanOfValues(Attention):
    """Each query's mean of the values it may see: what an approximation must beat. Its own reference
    (:func:`mean_reference`) agrees, so only the approximation check can catch it."""

    blend = 0.0  # the share of true softmax attention mixed in

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        count = torch.arange(1, value.shape[1] + 1, dtype=value.dtype, device=value.device).view(1, -1, 1)
        mean = value.cumsum(1) / count if is_causal else \
            value.mean(dim=1, keepdim=True).expand_as(value)
        return self.blend * super().forward(query, key, value, attn_mask, is_causal) + (1 - self.blend) * mean


def blended(share: float):
    """A :class:`MeanOfValues` with ``share`` of softmax attention mixed in."""
    return type(f"MeanOfValuesWith{share:g}Softmax", (MeanOfValues,), {"blend": share})


def mean_reference(module, query, key, value, attn_mask=None, is_causal=False):
    """The module itself in float64: a reference that shares the fast path's idea."""
    return module(query.double(), key.double(), value.double(), attn_mask, is_causal)
