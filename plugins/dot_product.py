"""Scaled dot-product attention: no parameters, heads split from the features; torch's fused SDPA."""

from torch import nn

import zoo
from zoo.functional import cached_attention, masked_sdpa, merge_heads, split_heads
from zoo.reference import reference_mask, softmax_attention


class DotProductAttention(nn.Module):
    """softmax(Q K^T / sqrt(d)) V per head, on inputs split into ``num_heads`` heads (no projections)."""

    def __init__(self, d_model: int, num_heads: int = 1):
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        h = self.num_heads
        out = masked_sdpa(split_heads(query, h), split_heads(key, h), split_heads(value, h), attn_mask, is_causal)
        return merge_heads(out)


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    h = module.num_heads
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    heads = [x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value)]
    return softmax_attention(*heads, mask).transpose(1, 2).flatten(2)


def decode(module, state, query, key, value, key_mask=None):
    """The next positions' outputs over the KV cache: keys and values split into heads, cached as they come."""
    h = module.num_heads
    out, state = cached_attention(state, split_heads(query, h), split_heads(key, h), split_heads(value, h), key_mask)
    return merge_heads(out), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize  # every key and value


DECODER = zoo.Decoder(prefill=lambda module, *inputs: decode(module, {}, *inputs), step=decode, growth="token",
                      state_bytes=cache_bytes)


def flops(batch, q_len, k_len, d_model, num_heads, **options):
    return 4.0 * batch * q_len * k_len * d_model  # Q K^T and P V, 2 FLOPs per multiply-add


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="dot-product",
        summary="Scaled dot-product attention over heads split from the inputs, on torch's fused SDPA.",
        family="softmax",
        citation="Vaswani et al. 2017, Attention Is All You Need",
        departures=(
            zoo.Departure("extension",
                          "num_heads splits the given features into heads without projections; the paper's heads come with W^Q, W^K, W^V"),
        ),
        factory=DotProductAttention,
        best_known="torch-sdpa",
        reference=reference,
        tags=zoo.Tags(),
        complexity=zoo.Complexity(time=2, memory=1),
        flops=flops,
        decoder=DECODER,
        targets=(
            zoo.Target("time-ratio", versus="torch-sdpa", at_most=1.05, phase="fwd",
                       note="within 1.05x of torch SDPA at every timed n"),
            zoo.Target("time-ratio", versus="torch-sdpa", at_most=1.05, phase="fwd+bwd",
                       note="within 1.05x of torch SDPA at every timed n"),
        ),
    ))
