"""Attention with learned sinks (as in gpt-oss): multi-head softmax attention in which each head's learned logit
``s_h`` joins every row's softmax denominator with no value, ``w_ij = exp(q_i k_j / sqrt d) / (exp(s_h) + sum_j'
exp(q_i k_j' / sqrt d))``, so a query may put its weight nowhere instead of on some key.

With the sink, a row's weights are its plain softmax weights times ``sigmoid(L_i - s_h)``, ``L_i`` the row's
logsumexp, which torch's fused CPU attention kernel returns beside its output: one fused call and a per-row factor
(:func:`zoo.functional.sdpa_with_sink`; on other devices the sink as one more key on fused SDPA), so nothing
(n, n) is built. Decoding keeps the plain KV cache; the sink is a parameter, not state.
"""

import math

import torch
from torch import nn

import zoo
from zoo.functional import (cached_attention, combine_masks, merge_heads, sdpa_with_sink, softmax_with_sink,
                            split_heads)
from zoo.reference import linear, reference_mask


class SinkAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1):
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))
        for layer in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.sinks = nn.Parameter(torch.zeros(num_heads))  # one learned logit per head

    def project(self, query, key, value):
        """Per head: queries, keys and values (batch, heads, n, d)."""
        return tuple(split_heads(layer(x), self.num_heads)
                     for layer, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = self.project(query, key, value)
        return self.out_proj(merge_heads(sdpa_with_sink(q, k, v, self.sinks, attn_mask, is_causal)))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """gpt-oss's form in float64: the scaled scores of the keys a query may see, each head's sink logit appended
    as one more column, softmax over the row, the sink's column dropped."""
    h = module.num_heads
    q, k, v = (linear(x, layer).unflatten(-1, (h, -1)).transpose(1, 2)
               for x, layer in ((query, module.q_proj), (key, module.k_proj), (value, module.v_proj)))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    if mask is not None:
        scores = scores.masked_fill(~mask.expand(scores.shape), float("-inf"))
    sink = module.sinks.detach().double().view(1, h, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return linear((weights @ v).transpose(1, 2).flatten(2), module.out_proj)


def decode(module, state, query, key, value, key_mask=None):
    """The next positions over the KV cache, each row's denominator with its head's sink."""
    q, k, v = module.project(query, key, value)
    out, state = cached_attention(state, q, k, v, key_mask, sink=module.sinks)
    return module.out_proj(merge_heads(out)), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize  # every projected key and value


def eager_sink_column(module):
    """A baseline, the form of gpt-oss's reference code: the (n, n) scores, the sink as one more column,
    softmax, the column dropped, then the values."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v = module.project(query, key, value)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mask = combine_masks(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return module.out_proj(merge_heads(softmax_with_sink(scores, module.sinks) @ v))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, **options):
    """The four projections and one fused attention call (the sink's per-row factor is not a matmul). Off the CPU
    the sink is one more key on heads one feature wider, after a zero query row: (q_len + 1) (k_len + 1)
    (d_model + num_heads) instead of q_len k_len d_model in the second term."""
    projections = 2.0 * batch * d_model * d_model * (2 * q_len + 2 * k_len)  # q, out; k, v
    return projections + 4.0 * batch * q_len * k_len * d_model


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="sinks",
        summary="Multi-head attention with a learned sink logit per head in each softmax denominator (gpt-oss), "
                "one fused attention call and its logsumexp.",
        family="softmax",
        citation="OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card (learned attention sinks); cf. Xiao et al. "
                 "2024, Efficient Streaming Language Models with Attention Sinks (ICLR)",
        departures=(
            zoo.Departure("omission", "full attention only: gpt-oss alternates layers banded to a 128-token window "
                                      "with full ones, both with sinks; no window option here (the zoo's windowed "
                                      "variant is the band without sinks)"),
            zoo.Departure("omission", "one key/value head per query head: gpt-oss groups 64 query heads over 8 "
                                      "key/value heads; no rotary embedding (YaRN)"),
            zoo.Departure("convention", "q, k, v and output projections with biases (as gpt-oss), weights "
                                        "Xavier-uniform, biases and sink logits starting at 0"),
        ),
        factory=SinkAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=1),
        baselines={"eager-sink-column": eager_sink_column},
        best_known="eager-sink-column",
        flops=flops,
        decoder=zoo.Decoder(prefill=lambda module, *inputs: decode(module, {}, *inputs), step=decode, growth="token",
                            state_bytes=cache_bytes),
        targets=(
            zoo.Target("time-ratio", versus="eager-sink-column", at_most=1.0, phase="fwd+bwd", n=1024,
                       note="no slower than gpt-oss's eager form: one fused call and its logsumexp"),
        ),
    ))
