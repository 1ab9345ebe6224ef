"""Multi-head self/cross attention with one fused input projection, on torch's fused SDPA.

Its parameters are named like ``nn.MultiheadAttention``'s, so either loads the other's state dict.
"""

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import cached_attention, merge_heads, projected_sdpa, split_heads, torch_mha_baseline
from zoo.reference import projected_softmax


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, bias: bool = True):
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model)) if bias else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        nn.init.xavier_uniform_(self.in_proj_weight)
        if bias:
            nn.init.zeros_(self.out_proj.bias)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        d, w, b = self.d_model, self.in_proj_weight, self.in_proj_bias
        bias = (None, None, None) if b is None else (b[:d], b[d:2 * d], b[2 * d:])
        if query is key and key is value:  # self-attention: one matmul for all three projections
            q, k, v = F.linear(query, w, b).chunk(3, dim=-1)
        elif key is value:
            q = F.linear(query, w[:d], bias[0])
            k, v = F.linear(key, w[d:], None if b is None else b[d:]).chunk(2, dim=-1)
        else:
            q, k, v = (F.linear(x, w[i * d:(i + 1) * d], bias[i]) for i, x in enumerate((query, key, value)))
        return projected_sdpa(q, k, v, self.num_heads, attn_mask, is_causal, self.out_proj)


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    d, w, b = module.d_model, module.in_proj_weight, module.in_proj_bias
    return projected_softmax(query, key, value, (w[:d], w[d:2 * d], w[2 * d:]),
                             (None,) * 3 if b is None else (b[:d], b[d:2 * d], b[2 * d:]),
                             module.out_proj.weight, module.out_proj.bias, module.num_heads, attn_mask, is_causal)


def decode(module, state, query, key, value, key_mask=None):
    """The next positions projected, their keys and values cached per head, attention over the cache, out-projected."""
    d, w, b, h = module.d_model, module.in_proj_weight, module.in_proj_bias, module.num_heads
    q, k, v = (F.linear(x, w[i * d:(i + 1) * d], None if b is None else b[i * d:(i + 1) * d])
               for i, x in enumerate((query, key, value)))
    out, state = cached_attention(state, split_heads(q, h), split_heads(k, h), split_heads(v, h), key_mask)
    return module.out_proj(merge_heads(out)), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize  # every projected key and value


def torch_mha(need_weights: bool):
    """A baseline: ``nn.MultiheadAttention`` sharing the same weights."""
    return torch_mha_baseline(need_weights, lambda m: {"embed_dim": m.d_model, "num_heads": m.num_heads,
                                                       "bias": m.in_proj_bias is not None},
                              lambda m, mha: m.state_dict())


def flops(batch, q_len, k_len, d_model, num_heads, **options):
    projections = 2.0 * batch * d_model * d_model * (2 * q_len + 2 * k_len)  # q, out; k, v
    return projections + 4.0 * batch * q_len * k_len * d_model


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="multi-head",
        summary="Multi-head attention (fused in-projection, out-projection) on torch's fused SDPA.",
        family="softmax",
        citation="Vaswani et al. 2017, Attention Is All You Need",
        departures=(
            zoo.Departure("extension",
                          "biases on the query, key, value and output projections, always on (nn.MultiheadAttention's layout); the paper has none"),
        ),
        factory=MultiHeadAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=1),
        baselines={"torch-mha": torch_mha(need_weights=False), "torch-mha-weights": torch_mha(need_weights=True)},
        best_known="torch-mha",
        flops=flops,
        decoder=zoo.Decoder(prefill=lambda module, *inputs: decode(module, {}, *inputs), step=decode, growth="token",
                            state_bytes=cache_bytes),
        targets=(
            zoo.Target("decode-ratio", versus="mha-kv-cache", at_most=1.1, mode="causal", phase="decode", n=4096,
                       note="decode within 1.1x of nn.MultiheadAttention's projections over a preallocated KV cache"),
            zoo.Target("decode-ratio", versus="mha-kv-cache", at_most=1.1, mode="causal", phase="decode", n=16384,
                       note="decode within 1.1x of nn.MultiheadAttention's projections over a preallocated KV cache"),
            zoo.Target("read-fraction", at_least=0.8, mode="causal", phase="decode", n=16384, batch=16,
                       note="a decode step at batch 16 reads its cache at 0.8 of the measured read bandwidth"),
            zoo.Target("time-ratio", versus="torch-mha", at_most=1.05, phase="fwd",
                       note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("time-ratio", versus="torch-mha", at_most=1.05, phase="fwd+bwd",
                       note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("time-ratio", versus="torch-mha-weights", at_most=1.0, phase="fwd",
                       note="faster than nn.MultiheadAttention's default path"),
        ),
    ))
