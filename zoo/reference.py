"""Textbook float64 attention for references: slow, explicit, independent of any fast path."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                      scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale, masked) v on (..., seq, d) in float64; rows with no allowed key give 0."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    return weighted_sum(scores, v, mask)


def weighted_sum(scores: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """softmax over the last axis of masked ``scores``, applied to ``v``; empty rows give 0."""
    if mask is not None:
        mask = mask.expand(scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = torch.where(mask.any(dim=-1, keepdim=True), weights, torch.zeros_like(weights))
    return torch.matmul(weights, v.double())


def positive_kernel_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """sum_j (phi_q_i . phi_k_j) v_j / sum_j phi_q_i . phi_k_j over the allowed keys, in float64, for a
    positive feature map; rows with no allowed key give 0."""
    similarity = phi_q.double() @ phi_k.double().transpose(-2, -1)
    if mask is not None:
        similarity = torch.where(mask, similarity, torch.zeros_like(similarity))
    total = similarity.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, (similarity @ v.double()) / torch.where(total > 0, total, 1.0), 0.0)


def segment_sums(log_gates: Tensor) -> Tensor:
    """(..., n) -> (..., n, n) in float64: ``[t, s]`` the sum of ``log_gates`` over positions s+1..t (0 where
    s >= t: pair it with a causal mask), over an explicit indicator of the positions between, not as a
    difference of cumulative sums. The log decay from key s to query t of every gated recurrence."""
    n = log_gates.shape[-1]
    t, s, l = torch.arange(n).view(n, 1, 1), torch.arange(n).view(1, n, 1), torch.arange(n).view(1, 1, n)
    return torch.einsum("...l,tsl->...ts", log_gates.double(), ((s < l) & (l <= t)).double())


def linear(x: Tensor, layer) -> Tensor:
    """An ``nn.Linear`` layer's map applied to ``x`` in float64 with the layer's own weights (for references
    of layers with projections)."""
    bias = 0.0 if layer.bias is None else layer.bias.detach().double()
    return x.double() @ layer.weight.detach().double().T + bias


def projected_softmax(query: Tensor, key: Tensor, value: Tensor, weights, biases, out_weight: Tensor,
                      out_bias: Tensor | None, num_heads: int, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    """Multi-head softmax attention of projected inputs, in float64: ``x @ w.T + b`` for each of query, key and
    value (``weights``, ``biases``: three each, a bias may be None), heads split, attention, heads merged, then
    the output projection. The reference of every layer that is projections around softmax attention."""
    projected = [x.double() @ w.detach().double().T + (0.0 if b is None else b.detach().double())
                 for x, w, b in zip((query, key, value), weights, biases)]
    heads = [x.unflatten(-1, (num_heads, -1)).transpose(1, 2) for x in projected]
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    out = softmax_attention(*heads, mask).transpose(1, 2).flatten(2)
    return out @ out_weight.detach().double().T + (0.0 if out_bias is None else out_bias.detach().double())


def reference_mask(attn_mask: Tensor | None, is_causal: bool, q_len: int, k_len: int) -> Tensor | None:
    """The mask a reference applies: ``attn_mask`` and, when causal, key j <= query i.

    Built from index comparisons rather than the fast paths' helpers, so the two stay independent.
    """
    mask = attn_mask
    if is_causal:
        rows = torch.arange(q_len).unsqueeze(-1)
        cols = torch.arange(k_len).unsqueeze(0)
        causal = cols <= rows
        if attn_mask is not None:
            causal = causal.to(attn_mask.device)
        mask = causal if mask is None else mask & causal
    return mask


class plain_precision(TorchFunctionMode):
    """Within it, reference code runs as plain torch in ``dtype``: every cast up (``.double()``, ``.float()``,
    ``.to(torch.float64)``, ``dtype=torch.float32``) keeps ``dtype`` instead. The textbook math computed without
    the references' upcasting, which is what FlashAttention's rule compares a low-precision kernel with (its error
    at most twice plain torch's in the same precision)."""

    UPCASTS = (torch.float32, torch.float64)

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (Tensor.double, Tensor.float):
            return args[0].to(self.dtype)
        args = tuple(self.dtype if isinstance(a, torch.dtype) and a in self.UPCASTS else a for a in args)
        if kwargs.get("dtype") in self.UPCASTS:
            kwargs["dtype"] = self.dtype
        return func(*args, **kwargs)
