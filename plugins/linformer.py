"""Linformer (Wang et al. 2020): keys and values are projected along the sequence, from k_len positions to
``proj_len`` learned mixtures, so each query attends to ``proj_len`` keys and the cost is O(n * proj_len).

A layer (query/key/value/output projections like multi-head attention) with two learned length projections
E and F of shape (proj_len, max_len), shared by the heads (the paper's "headwise sharing"); a shorter
sequence uses their first k_len columns. The key and value projections run after the mixing, on proj_len rows
(linear maps commute: E (x W^T + b) = (E x) W^T + (E 1) b). It approximates softmax attention only once E and F are trained,
and, being a layer, is not measured against softmax on the same inputs (the board says why). No causal
mode and no attention mask: mixing positions before attending cannot keep either.
"""

import math

import torch
from torch import nn

import zoo
from zoo.functional import merge_heads, split_heads
from zoo.reference import linear, softmax_attention


def _mixed_first(mix, layer, x):
    """E (x W^T + b) as (E x) W^T + (E 1) b: the projection runs on proj_len rows instead of the sequence's."""
    return _projected(mix @ x, mix, layer)


class LinformerAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, proj_len: int = 256, max_len: int = 16384, bias: bool = True):
        super().__init__()
        for label, value in (("proj_len", proj_len), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        self.d_model, self.num_heads, self.proj_len, self.max_len = d_model, num_heads, proj_len, max_len
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=bias) for _ in range(4))
        bound = 1 / math.sqrt(proj_len)
        self.length_proj = nn.Parameter(torch.empty(2, proj_len, max_len).uniform_(-bound, bound))  # E, F

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        k_len = key.shape[1]
        if k_len > self.max_len:
            raise ValueError(f"linformer: {k_len} keys, more than its max_len={self.max_len} (a build option)")
        h = self.num_heads
        e, f = self.length_proj[:, :, :k_len]
        q = split_heads(self.q_proj(query), h)
        k, v = (split_heads(_mixed_first(mix, layer, x), h) for mix, layer, x in ((e, self.k_proj, key), (f, self.v_proj, value)))
        return self.out_proj(merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v)))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """Keys and values projected, mixed along the sequence by E and F, then softmax attention, in float64."""
    h, k_len = module.num_heads, key.shape[1]
    e, f = module.length_proj.detach().double()[:, :, :k_len]
    q = linear(query, module.q_proj).unflatten(-1, (h, -1)).transpose(1, 2)
    k = torch.einsum("pm,bmd->bpd", e, linear(key, module.k_proj)).unflatten(-1, (h, -1)).transpose(1, 2)
    v = torch.einsum("pm,bmd->bpd", f, linear(value, module.v_proj)).unflatten(-1, (h, -1)).transpose(1, 2)
    return linear(softmax_attention(q, k, v).transpose(1, 2).flatten(2), module.out_proj)


def flops(batch, q_len, k_len, d_model, num_heads, proj_len=256, **options):
    projections = 2.0 * batch * d_model * d_model * (2 * q_len + 2 * proj_len)  # q, out; k, v after the mixing
    mixing = 2 * 2.0 * batch * proj_len * k_len * d_model  # E K and F V
    return projections + mixing + 4.0 * batch * q_len * proj_len * d_model


def _projected(mixed, mix, layer):
    """(E x) W^T + (E 1) b from the already mixed rows E x."""
    out = torch.nn.functional.linear(mixed, layer.weight)
    return out if layer.bias is None else out + mix.sum(-1, keepdim=True) * layer.bias


def stacked_mixing(module):
    """The mix-first form with both length projections in one matmul when keys and values are one tensor
    (self-attention): [E; F] x on 2 proj_len rows, then each half through its projection, then SDPA."""
    def run(query, key, value, attn_mask=None, is_causal=False):
        h, k_len, p = module.num_heads, key.shape[1], module.proj_len
        mixes = module.length_proj[:, :, :k_len]
        if key is value:
            both = mixes.flatten(0, 1) @ key  # (batch, 2 proj_len, d_model)
            mixed = (both[:, :p], both[:, p:])
        else:
            mixed = (mixes[0] @ key, mixes[1] @ value)
        k, v = (split_heads(_projected(x, mix, layer), h) for x, mix, layer in zip(mixed, mixes, (module.k_proj, module.v_proj)))
        q = split_heads(module.q_proj(query), h)
        return module.out_proj(merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v)))
    return run


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="linformer",
        summary="Linformer: keys and values mixed along the sequence to proj_len learned rows; O(n * proj_len).",
        family="low-rank",
        citation="Wang et al. 2020, Linformer: Self-Attention with Linear Complexity",
        departures=(
            zoo.Departure("substitution",
                          "E and F are shared by the heads of a layer (the paper's headwise sharing); its base form has E_i, F_i per head"),
            zoo.Departure("omission",
                          "no key-value or layerwise sharing, no nonuniform projected lengths, no pooling or convolution projections"),
            zoo.Departure("extension",
                          "a sequence shorter than max_len uses the first k_len columns of E and F (the paper fixes n)"),
            zoo.Departure("extension",
                          "biases on the query, key, value and output projections; E and F mix the biased key and value projections"),
        ),
        factory=LinformerAttention,
        reference=reference,
        approximates="softmax",
        tags=zoo.Tags(has_parameters=True, accepts_attn_mask=False, supports_causal=False, key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"proj_len": 256, "max_len": 16384},
        check_options={"proj_len": 4, "max_len": 64},
        quality_options={"proj_len": 16},  # 256 is more than the quality tasks' 16-144 tokens: no low rank there
        baselines={"stacked-mixing": stacked_mixing},
        best_known="stacked-mixing",
        flops=flops,
        targets=(
            zoo.Target("time-ratio", versus="torch-mha-layer", at_most=1.0, phase="fwd+bwd", n=1024,
                       note="faster than nn.MultiheadAttention at n=1024 (proj_len 256)"),
        ),
    ))
