"""Differential attention (Ye et al. 2024): the difference of two softmax maps cancels the attention
both give to irrelevant context.

Each head's query and key are split in halves (q1, q2), (k1, k2); the head's output is
``(softmax(q1 k1^T / sqrt(d/2)) - lambda * softmax(q2 k2^T / sqrt(d/2))) v``, RMS-normalised and scaled
by ``1 - lambda_init``, with the learned ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init``.
The fast path is the paper's FlashAttention form: four half-width attentions (each map times each half
of v), here in one SDPA call. Half-precision inputs are attended in float32: the subtraction cancels most
of each map, which would multiply half precision's rounding error by up to 1 / (1 - lambda).
"""

import math

import torch
from torch import nn

import zoo
from zoo.functional import masked_sdpa, merge_heads, split_heads
from zoo.reference import linear, reference_mask, softmax_attention


class DifferentialAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, lambda_init: float = 0.8, bias: bool = True):
        super().__init__()
        head_dim = d_model // num_heads
        if head_dim % 2:
            raise ValueError(f"differential attention splits each head's queries and keys in halves: it needs an "
                             f"even per-head width, got d_model={d_model} / num_heads={num_heads} = {head_dim}")
        if isinstance(lambda_init, bool) or not isinstance(lambda_init, (int, float)) or not 0 <= lambda_init < 1:
            raise ValueError(f"lambda_init must be a number in [0, 1), got {lambda_init!r}")
        self.d_model, self.num_heads, self.lambda_init, self.eps = d_model, num_heads, float(lambda_init), 1e-5
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=bias) for _ in range(4))
        self.lambdas = nn.Parameter(torch.randn(4, head_dim // 2) * 0.1)  # lq1, lk1, lq2, lk2
        self.norm_weight = nn.Parameter(torch.ones(head_dim))

    def lam(self):
        lq1, lk1, lq2, lk2 = self.lambdas
        return torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + self.lambda_init

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        h = self.num_heads
        q, k, v = (split_heads(layer(x), h) for layer, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        (q1, q2), (k1, k2), (v1, v2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1), v.chunk(2, dim=-1)
        # Fused SDPA kernels need equal query and value widths, so each map meets each half of v: four
        # half-width attentions (scaled by 1/sqrt(d/2), as the paper does) in one call, stacked on the batch.
        batch, dtype = q.shape[0], q.dtype
        if dtype in (torch.float16, torch.bfloat16):  # the subtraction cancels most of each map: keep the digits
            q1, q2, k1, k2, v1, v2 = (x.float() for x in (q1, q2, k1, k2, v1, v2))
        if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[0] > 1:
            attn_mask = attn_mask.repeat(4, 1, 1, 1)
        out = masked_sdpa(torch.cat((q1, q1, q2, q2)), torch.cat((k1, k1, k2, k2)), torch.cat((v1, v2, v1, v2)),
                          attn_mask, is_causal)
        a1, a2, b1, b2 = out.unflatten(0, (4, batch)).unbind(0)
        out = torch.cat((a1, a2), dim=-1) - self.lam() * torch.cat((b1, b2), dim=-1)
        out = (out * torch.rsqrt(out.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(dtype) * self.norm_weight
        return self.out_proj(merge_heads(out * (1 - self.lambda_init)))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """The two softmax maps built separately and subtracted, then RMS norm, in float64."""
    h = module.num_heads
    q, k, v = (linear(x, layer).unflatten(-1, (h, -1)).transpose(1, 2)
               for x, layer in ((query, module.q_proj), (key, module.k_proj), (value, module.v_proj)))
    half = q.shape[-1] // 2
    lq1, lk1, lq2, lk2 = module.lambdas.detach().double()
    lam = math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + module.lambda_init
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    eye = torch.eye(v.shape[2], dtype=torch.float64)  # softmax maps themselves: attention applied to the identity
    first = softmax_attention(q[..., :half], k[..., :half], eye.expand(*v.shape[:2], -1, -1), mask)
    second = softmax_attention(q[..., half:], k[..., half:], eye.expand(*v.shape[:2], -1, -1), mask)
    out = (first - lam * second) @ v
    rms = torch.sqrt((out ** 2).mean(dim=-1, keepdim=True) + module.eps)
    out = out / rms * module.norm_weight.detach().double() * (1 - module.lambda_init)
    return linear(out.transpose(1, 2).flatten(2), module.out_proj)


def flops(batch, q_len, k_len, d_model, num_heads, **options):
    projections = 2.0 * batch * d_model * d_model * (2 * q_len + 2 * k_len)  # q, out; k, v
    return projections + 8.0 * batch * q_len * k_len * d_model  # four half-width attentions


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="differential",
        summary="Differential attention: two softmax maps on half-width queries/keys, subtracted (learned lambda).",
        family="softmax",
        citation="Ye et al. 2024, Differential Transformer",
        factory=DifferentialAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=1),
        options={"lambda_init": 0.8},
        flops=flops,
        targets=(
            zoo.Target("time-ratio", versus="torch-mha-layer", at_most=2.0, phase="fwd",
                       note="at most 2x nn.MultiheadAttention's forward"),
            zoo.Target("time-ratio", versus="torch-mha-layer", at_most=2.0, phase="fwd+bwd",
                       note="at most 2x nn.MultiheadAttention's fwd+bwd"),
        ),
    ))
