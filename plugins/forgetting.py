"""Forgetting attention (the Forgetting Transformer, FoX): causal softmax attention whose logits are biased by a
data-dependent forget gate, ``softmax(q k^T / sqrt(d) + D)`` with ``D_ij = sum_{l=j+1..i} log f_l`` and
``f_t = sigmoid(w_f . x_t + b_f)`` per head.

The bias is a difference of cumulative sums, ``D_ij = c_i - c_j`` with ``c_i = sum_{l<=i} log f_l``, so it is
one more rank-2 term of the logits: queries ``[q_i / sqrt(d), c_i, 1]`` against keys ``[k_j, 1, -c_j]`` give
``q_i k_j / sqrt(d) + c_i - c_j`` exactly. Torch's fused causal SDPA then runs on heads two features wider,
so no (n, n) bias is ever built: O(n) memory, as the paper's FlashAttention kernel. The cumulative sums are
taken in the working dtype, as the paper's kernel takes them in float32. Decoding keeps each token's key, value
and the bias ``-c_j`` of its logits: the KV cache plus one number per head and token.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import cached_attention, combine_masks, merge_heads, sdpa_zeroing_empty_rows, split_heads
from zoo.reference import linear, reference_mask, segment_sums, weighted_sum


class ForgettingAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1):
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=False)
                                                                for _ in range(4))
        for layer in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)
        self.forget_proj = nn.Linear(d_model, num_heads)  # the forget gate's logit per head
        nn.init.zeros_(self.forget_proj.bias)

    def project(self, query, key, value):
        """Per head: queries, keys, values (batch, heads, n, d) and the log forget gates (batch, heads, n), each
        position's gate read from its token as the query input gives it (so a masked key's inputs reach nothing)."""
        h = self.num_heads
        q, k, v = (split_heads(layer(x), h) for layer, x in ((self.q_proj, query), (self.k_proj, key),
                                                            (self.v_proj, value)))
        return q, k, v, F.logsigmoid(self.forget_proj(query)).transpose(1, 2)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v, log_forget = self.project(query, key, value)
        return self.out_proj(merge_heads(forgetting_sdpa(q, k, v, log_forget.cumsum(-1), attn_mask)))


def widened(q, k, c):
    """Queries and keys two features wider whose dot products, at SDPA's default scale, are the biased logits
    ``q k^T / sqrt(d) + c_i - c_j``: the scale of the wider heads is folded into the queries."""
    d, ones = q.shape[-1], torch.ones_like(c).unsqueeze(-1)
    wide_q = torch.cat([q / math.sqrt(d), c.unsqueeze(-1), ones], dim=-1) * math.sqrt(d + 2)
    return wide_q, torch.cat([k, ones, -c.unsqueeze(-1)], dim=-1)


def forgetting_sdpa(q, k, v, c, attn_mask=None):
    """Causal softmax attention with the forget-gate bias ``c_i - c_j`` on torch's fused SDPA (a user's mask
    too; rows with no key give zeros)."""
    wide_q, wide_k = widened(q, k, c)
    wide_v = F.pad(v, (0, 2))  # one head width for all three keeps SDPA on its fused kernel
    if attn_mask is None:
        out = F.scaled_dot_product_attention(wide_q, wide_k, wide_v, is_causal=True)
    else:
        mask = combine_masks(attn_mask, True, q.shape[-2], k.shape[-2], q.device)
        out = sdpa_zeroing_empty_rows(wide_q, wide_k, wide_v, mask)
    return out[..., :v.shape[-1]]


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """The paper's form in float64: the (n, n) bias D_ij = sum of log f over positions j+1..i, added to the scaled
    logits, softmax over the keys a query may see (none: zeros)."""
    h, n = module.num_heads, query.shape[1]
    q, k, v = (linear(x, layer).unflatten(-1, (h, -1)).transpose(1, 2)
               for x, layer in ((query, module.q_proj), (key, module.k_proj), (value, module.v_proj)))
    log_forget = torch.nn.functional.logsigmoid(linear(query, module.forget_proj)).transpose(1, 2)  # (b, h, n)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + segment_sums(log_forget)
    mask = reference_mask(attn_mask, True, n, n)
    out = weighted_sum(scores, v, mask).transpose(1, 2).flatten(2)
    return linear(out, module.out_proj)


def decode(module, state, query, key, value, key_mask=None):
    """The next positions over the KV cache, each key cached with its bias ``-c_j`` (the query's ``c_i`` is the
    same for every key it sees, so softmax ignores it)."""
    q, k, v, log_forget = module.project(query, key, value)
    cached = state.get("key_bias")
    before = -cached[..., -1:] if cached is not None and cached.shape[-1] else 0.0
    out, state = cached_attention(state, q, k, v, key_mask, key_bias=-(before + log_forget.cumsum(-1)))
    return module.out_proj(merge_heads(out)), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return batch * context * (2 * d_model + num_heads) * itemsize  # keys, values and c_j per head and token


def bias_sdpa(module):
    """A baseline: the same projections, then torch SDPA with the dense (n, n) forget-gate bias as a float mask."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v, log_forget = module.project(query, key, value)
        c, n = log_forget.cumsum(-1), query.shape[1]
        allowed = combine_masks(attn_mask, True, n, n, query.device)
        bias = (c.unsqueeze(-1) - c.unsqueeze(-2)).masked_fill(~allowed, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).nan_to_num(0.0)
        return module.out_proj(merge_heads(out))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, **options):
    projections = 2.0 * batch * d_model * d_model * (2 * q_len + 2 * k_len)  # q, out; k, v
    gate = 2.0 * batch * k_len * d_model * num_heads
    return projections + gate + 4.0 * batch * q_len * k_len * (d_model + 2 * num_heads)  # heads two features wider


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="forgetting",
        summary="Forgetting attention (FoX): causal softmax with a data-dependent forget-gate bias, on fused SDPA.",
        family="softmax",
        citation="Lin et al. 2025, Forgetting Transformer: Softmax Attention with a Forget Gate (ICLR)",
        departures=(
            zoo.Departure("omission", "the basic FoX layer: none of the 'Pro' block's output gate, output norm, "
                                      "QK-norm or key/value shift"),
            zoo.Departure("convention", "the gate reads the query input (in self-attention the token x_t, as in "
                                        "the paper; a masked key's inputs then reach nothing); q, k, v and output weights initialised Xavier-uniform, the paper's "
                                        "code draws them from N(0, 0.02^2); the gate's bias starts at 0 as there"),
        ),
        factory=ForgettingAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, causal_only=True, key_order_invariant=False,
                      allows_different_lengths=False),
        complexity=zoo.Complexity(time=2, memory=1),
        baselines={"sdpa-dense-bias": bias_sdpa},
        best_known="sdpa-dense-bias",
        flops=flops,
        decoder=zoo.Decoder(prefill=lambda module, *inputs: decode(module, {}, *inputs), step=decode, growth="token",
                            state_bytes=cache_bytes),
        targets=(
            zoo.Target("time-ratio", versus="sdpa-dense-bias", at_most=1.0, mode="causal", phase="fwd+bwd", n=1024,
                       note="no slower than SDPA with the dense (n, n) bias: the bias as two extra head features"),
        ),
    ))
