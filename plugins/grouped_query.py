"""Grouped-query attention (Ainslie et al. 2023): the query heads share fewer key/value heads, so the
key/value projections (and a decoder's KV cache) shrink by num_heads / kv_heads. Multi-query attention
(Shazeer 2019) is its kv_heads = 1 case, registered under its own name.

The forward hands the shared heads to torch SDPA with ``enable_gqa=True``; where a backward follows, they are
repeated to a full set of heads first (see :func:`attend`). The baseline always repeats them, as code written
before ``enable_gqa`` does.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import append
from zoo.functional import (cached_attention, masked_sdpa, merge_heads, project_qkv, sdpa_zeroing_empty_rows,
                            split_heads)
from zoo.reference import linear, reference_mask, softmax_attention


def default_kv_heads(num_heads: int) -> int:
    """The largest divisor of num_heads that is at most half of it (1 for one or two heads)."""
    return max(d for d in range(1, max(1, num_heads // 2) + 1) if num_heads % d == 0)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, kv_heads: int | None = None, bias: bool = True):
        super().__init__()
        kv_heads = default_kv_heads(num_heads) if kv_heads is None else kv_heads
        if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or num_heads % kv_heads:
            raise ValueError(f"kv_heads must be a positive divisor of num_heads={num_heads}, got {kv_heads!r}")
        self.d_model, self.num_heads, self.kv_heads = d_model, num_heads, kv_heads
        kv_width = kv_heads * (d_model // num_heads)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def projections(self, query, key, value):
        q, k, v = project_qkv((self.q_proj, self.k_proj, self.v_proj), query, key, value)
        return split_heads(q, self.num_heads), split_heads(k, self.kv_heads), split_heads(v, self.kv_heads)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = self.projections(query, key, value)
        return self.out_proj(merge_heads(attend(q, k, v, attn_mask, is_causal)))


def attend(q, k, v, attn_mask, is_causal):
    """SDPA of the query heads over their groups' key/value heads: with ``enable_gqa`` where no gradient is taken,
    and with each key/value head repeated to its group's query heads (a broadcast view copied once, whose backward
    sums the group) where one is: torch's CPU SDPA backward with ``enable_gqa`` ran 1.2-1.4x the repeated form's
    at n = 1024-4096, and 5x under load."""
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
        return masked_sdpa(q, k, v, attn_mask, is_causal, enable_gqa=True)
    batch, groups, length, width = k.shape
    repeats = q.shape[1] // groups
    k, v = (x[:, :, None].expand(batch, groups, repeats, length, width).reshape(batch, groups * repeats, length,
                                                                                 width) for x in (k, v))
    return masked_sdpa(q, k, v, attn_mask, is_causal)


class MultiQueryAttention(GroupedQueryAttention):
    def __init__(self, d_model: int, num_heads: int = 1, bias: bool = True):
        super().__init__(d_model, num_heads, kv_heads=1, bias=bias)


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """Every query head against its group's key/value head, written out in float64."""
    h, g = module.num_heads, module.kv_heads
    q = linear(query, module.q_proj).unflatten(-1, (h, -1)).transpose(1, 2)
    k, v = (linear(x, layer).unflatten(-1, (g, -1)).transpose(1, 2)
            for x, layer in ((key, module.k_proj), (value, module.v_proj)))
    group = torch.arange(h) // (h // g)  # query head i reads key/value head i // (h / g)
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    out = softmax_attention(q, k[:, group], v[:, group], mask).transpose(1, 2).flatten(2)
    return linear(out, module.out_proj)


def repeated_kv(module):
    """A baseline: the shared key/value heads repeated to one per query head, then plain SDPA."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v = module.projections(query, key, value)
        repeats = module.num_heads // module.kv_heads
        k, v = (x.repeat_interleave(repeats, dim=1) for x in (k, v))
        return module.out_proj(merge_heads(masked_sdpa(q, k, v, attn_mask, is_causal)))

    return run


def prefill(module, query, key, value, key_mask=None):
    """Only the kv_heads shared key/value heads are cached; each query head reads its group's through SDPA's GQA."""
    q, k, v = module.projections(query, key, value)
    out, state = cached_attention({}, q, k, v, key_mask, enable_gqa=True)
    return module.out_proj(merge_heads(out)), state


def step(module, state, query, key, value, key_mask=None):
    """One token, its key and value appended to the cache of :func:`prefill`. A group's query heads go to SDPA as
    that many queries of its kv head, so each cached head is read once: with enable_gqa, torch's CPU kernel reads
    it once per query head (multi-query's step took 1.4-1.8x as long at context 4096)."""
    q, k, v = module.projections(query, key, value)
    batch, heads, groups = q.shape[0], module.num_heads, module.kv_heads
    state = dict(state)
    before = state["k"].shape[2]
    state["k"], state["v"] = append(state["k"], k, 2), append(state["v"], v, 2)
    grouped = q.reshape(batch, groups, heads // groups, -1)  # query head i is member i % r of group i // r
    if key_mask is None and "key_mask" not in state:
        out = F.scaled_dot_product_attention(grouped, state["k"], state["v"])
    else:
        kept = state.get("key_mask", torch.ones(batch, before, dtype=torch.bool, device=k.device))
        new = torch.ones(batch, 1, dtype=torch.bool, device=k.device) if key_mask is None else key_mask.to(torch.bool)
        state["key_mask"] = append(kept, new, 1)
        out = sdpa_zeroing_empty_rows(grouped, state["k"], state["v"], state["key_mask"][:, None, None, :])
    return module.out_proj(merge_heads(out.reshape(batch, heads, 1, -1))), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, kv_heads=None, **options):
    """kv_heads / num_heads of multi-head attention's cache (1 / num_heads for multi-query)."""
    kv_heads = default_kv_heads(num_heads) if kv_heads is None else kv_heads
    return 2 * batch * context * kv_heads * (d_model // num_heads) * itemsize  # each kv head's key and value


DECODER = zoo.Decoder(prefill=prefill, step=step, growth="token", state_bytes=cache_bytes)
MULTI_QUERY_DECODER = zoo.Decoder(prefill=prefill, step=step, growth="token",
                                  state_bytes=functools.partial(cache_bytes, kv_heads=1))


def flops(batch, q_len, k_len, d_model, num_heads, kv_heads=None, **options):
    kv_heads = default_kv_heads(num_heads) if kv_heads is None else kv_heads
    kv_width = kv_heads * (d_model // num_heads)
    projections = 2.0 * batch * d_model * (2 * q_len * d_model + 2 * k_len * kv_width)  # q, out; k, v
    return projections + 4.0 * batch * q_len * k_len * d_model


TARGETS = (
    zoo.Target("time-ratio", versus="repeated-kv", at_most=1.05, phase="fwd",
               note="within 1.05x of SDPA on key/value heads repeated per query head"),
    zoo.Target("time-ratio", versus="repeated-kv", at_most=1.05, phase="fwd+bwd",
               note="within 1.05x of SDPA on repeated key/value heads"),
)


@zoo.hookimpl
def zoo_register_variants(register):
    common = dict(family="softmax", reference=reference, tags=zoo.Tags(has_parameters=True),
                  complexity=zoo.Complexity(time=2, memory=1), baselines={"repeated-kv": repeated_kv},
                  best_known="repeated-kv")
    register(zoo.Variant(
        name="grouped-query",
        summary="Grouped-query attention: query heads share kv_heads key/value heads (SDPA enable_gqa).",
        citation="Ainslie et al. 2023, GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints",
        departures=(
            zoo.Departure("substitution",
                          "default kv_heads is the largest divisor of num_heads up to num_heads / 2 (4 of 8); the paper mostly uses 8 groups"),
            zoo.Departure("omission",
                          "no uptraining: converting a multi-head checkpoint (mean-pooled key/value heads) is left to the user"),
            zoo.Departure("extension",
                          "biases on all four projections, always on; the paper's T5 projections have none"),
        ),
        factory=GroupedQueryAttention, options={"kv_heads": None}, flops=flops, decoder=DECODER, **common,
        targets=TARGETS + (zoo.Target("state-ratio", versus="mha-kv-cache", at_least=0.5, at_most=0.5, mode="causal", phase="decode",
                                      note="at 8 heads its default 4 key/value heads: a KV cache exactly 4/8 of "
                                           "multi-head's"),),
    ))
    register(zoo.Variant(
        name="multi-query",
        summary="Multi-query attention: every query head shares one key/value head.",
        citation="Shazeer 2019, Fast Transformer Decoding: One Write-Head is All You Need",
        departures=(
            zoo.Departure("extension", "biases on all four projections, always on; the paper's equations have none"),
        ),
        factory=MultiQueryAttention, flops=functools.partial(flops, kv_heads=1), decoder=MULTI_QUERY_DECODER,
        **common, targets=TARGETS + (zoo.Target("state-ratio", versus="mha-kv-cache", at_least=1 / 8, at_most=1 / 8,
                                                mode="causal", phase="decode", note="at 8 heads: a KV cache exactly 1/8 of multi-head's"),),
    ))
