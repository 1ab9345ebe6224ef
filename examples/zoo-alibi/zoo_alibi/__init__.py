"""ALiBi: softmax attention with a per-head linear distance penalty instead of position embeddings.

score(i, j) = q_i . k_j / sqrt(d) - m_h |i - j|, with head slopes m_h = 2^(-8 h / H) (Press et al. 2022).
Positions are top-left aligned, as for ``is_causal``. The bias is an (heads, q_len, k_len) matrix,
so time and memory are quadratic; torch's fused SDPA takes it as a float mask.
"""

import torch
from torch import nn

import zoo
from zoo.functional import combine_masks, merge_heads, split_heads
from zoo.reference import weighted_sum


def head_slopes(num_heads: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)])


class ALiBiAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1):
        super().__init__()
        self.num_heads = num_heads
        self.register_buffer("slopes", head_slopes(num_heads), persistent=False)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        q_len, k_len = q.shape[-2], k.shape[-2]
        distance = (torch.arange(q_len, device=q.device).view(-1, 1) - torch.arange(k_len, device=q.device)).abs()
        bias = -self.slopes.to(q.dtype).view(-1, 1, 1) * distance.to(q.dtype)  # (heads, q_len, k_len)
        mask = combine_masks(attn_mask, is_causal, q_len, k_len, q.device)
        if mask is None:
            return merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias))
        row_ok = mask.any(dim=-1, keepdim=True)
        bias = bias.masked_fill(~(mask | ~row_ok), float("-inf"))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return merge_heads(out.masked_fill(~row_ok, 0.0))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """Scores written out with einsum and explicit positions, in float64."""
    h = module.num_heads
    q, k, v = (x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value))
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / q.shape[-1] ** 0.5
    i = torch.arange(q.shape[2], dtype=torch.float64).view(-1, 1)
    j = torch.arange(k.shape[2], dtype=torch.float64).view(1, -1)
    slopes = torch.tensor([2.0 ** (-8.0 * (n + 1) / h) for n in range(h)], dtype=torch.float64)
    scores = scores - slopes.view(-1, 1, 1) * (i - j).abs()
    mask = attn_mask
    if is_causal:
        causal = j <= i
        mask = causal if mask is None else mask & causal
    return weighted_sum(scores, v, mask).transpose(1, 2).flatten(2)


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="alibi",
        summary="Softmax attention with per-head linear distance biases (ALiBi), on torch's fused SDPA.",
        family="softmax",
        citation="Press, Smith and Lewis 2022, Train Short, Test Long: Attention with Linear Biases",
        factory=ALiBiAttention,
        reference=reference,
        tags=zoo.Tags(key_order_invariant=False),  # the bias depends on positions
        approximates=None,  # exact for its own function (softmax with a bias): never measured against plain softmax
        complexity=zoo.Complexity(time=2, memory=2),  # the (heads, n, n) bias matrix
    ))
