"""Differential attention (Ye et al. 2024): the difference of two softmax maps cancels the attention
both give to irrelevant context.

Each head's query and key are split in halves (q1, q2), (k1, k2); the head's output is
``(softmax(q1 k1^T / sqrt(d/2)) - lambda * softmax(q2 k2^T / sqrt(d/2))) v``, RMS-normalised and scaled
by ``1 - lambda_init``, with the learned ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init``.
The fast path is the paper's FlashAttention form: four half-width attentions (each map times each half
of v), four SDPA calls on views (the baseline stacks them into one call, at the cost of copies). Half-precision inputs are attended in float32: the subtraction cancels most
of each map, which would multiply half precision's rounding error by up to 1 / (1 - lambda). Decoding
keeps multi-head attention's cache of keys and values (in float32 for half precision, as they are attended).
"""

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import append
from zoo.functional import masked_sdpa, merge_heads, sdpa_zeroing_empty_rows, split_heads
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

    def projections(self, query, key, value):
        """q, k, v per head, in float32 for half-precision projections (as the maps are attended), and the
        projections' dtype, which the output returns to."""
        h = self.num_heads
        q, k, v = (split_heads(layer(x), h) for layer, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        dtype = q.dtype
        if dtype in (torch.float16, torch.bfloat16):  # the subtraction cancels most of each map: keep the digits
            q, k, v = q.float(), k.float(), v.float()
        return q, k, v, dtype

    def combine(self, first, second, dtype):
        """The output from each head's two maps applied to v: their difference, RMS-normalised, out-projected."""
        out = first - self.lam() * second
        out = (out * torch.rsqrt(out.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(dtype) * self.norm_weight
        return self.out_proj(merge_heads(out * (1 - self.lambda_init)))

    def maps(self, q, k, v, attn_mask=None, is_causal=False):
        """Each head's two softmax maps applied to v: four half-width attentions (scaled by 1/sqrt(d/2), as the
        paper does), each map meeting each half of v, since fused SDPA kernels need equal query and value widths.
        Four calls on views of q, k and v copy nothing, so autograd keeps no stacked copies for the backward."""
        (q1, q2), (k1, k2), (v1, v2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1), v.chunk(2, dim=-1)
        first, second = ([masked_sdpa(qi, ki, vi, attn_mask, is_causal) for vi in (v1, v2)] for qi, ki in ((q1, k1), (q2, k2)))
        return torch.cat(first, dim=-1), torch.cat(second, dim=-1)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v, dtype = self.projections(query, key, value)
        return self.combine(*self.maps(q, k, v, attn_mask, is_causal), dtype)


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


def prefill(module, query, key, value, key_mask=None):
    """The prompt through the causal forward's maps; its keys and values cached as they are attended."""
    q, k, v, dtype = module.projections(query, key, value)
    first, second = module.maps(q, k, v, None if key_mask is None else key_mask[:, None, None, :], is_causal=True)
    state = {"k": append(None, k, 2), "v": append(None, v, 2)}
    if key_mask is not None:
        state["key_mask"] = append(None, key_mask.to(torch.bool), 1)
    return module.combine(first, second, dtype), state


def step(module, state, query, key, value, key_mask=None):
    """The next position's two maps over the cache in one SDPA call: its query as two rows, (q1, 0) and (0, q2)
    times sqrt(2), which score the full-width cached keys as q1 k1^T / sqrt(d/2) and q2 k2^T / sqrt(d/2), so
    the cache is multi-head attention's and each cached key and value is read once."""
    q, k, v, dtype = module.projections(query, key, value)
    state = dict(state)
    before = state["k"].shape[2]
    state["k"], state["v"] = append(state["k"], k, 2), append(state["v"], v, 2)
    if key_mask is not None or "key_mask" in state:
        ones = functools.partial(torch.ones, q.shape[0], dtype=torch.bool, device=q.device)
        new = ones(1) if key_mask is None else key_mask.to(torch.bool)
        state["key_mask"] = append(state.get("key_mask", ones(before)), new, 1)
    q1, q2 = (q * math.sqrt(2)).chunk(2, dim=-1)
    zeros = torch.zeros_like(q1)
    rows = torch.cat((torch.cat((q1, zeros), dim=-1), torch.cat((zeros, q2), dim=-1)), dim=2)
    if "key_mask" in state:
        out = sdpa_zeroing_empty_rows(rows, state["k"], state["v"], state["key_mask"][:, None, None, :])
    else:
        out = F.scaled_dot_product_attention(rows, state["k"], state["v"])
    return module.combine(*out.split(1, dim=2), dtype), state


def stacked_call(module):
    """The same four half-width attentions stacked on the batch and handed to SDPA in one call: one kernel
    launch, at the price of copying q, k and v into the stack (which autograd then keeps)."""
    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v, dtype = module.projections(query, key, value)
        (q1, q2), (k1, k2), (v1, v2) = q.chunk(2, dim=-1), k.chunk(2, dim=-1), v.chunk(2, dim=-1)
        batch = q.shape[0]
        if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[0] > 1:
            attn_mask = attn_mask.repeat(4, 1, 1, 1)
        out = masked_sdpa(torch.cat((q1, q1, q2, q2)), torch.cat((k1, k1, k2, k2)), torch.cat((v1, v2, v1, v2)),
                          attn_mask, is_causal)
        a1, a2, b1, b2 = out.unflatten(0, (4, batch)).unbind(0)
        return module.combine(torch.cat((a1, a2), dim=-1), torch.cat((b1, b2), dim=-1), dtype)
    return run


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * max(itemsize, 4)  # every key and value, float32 for half precision


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
        departures=(
            zoo.Departure("substitution",
                          "lambda_init is one constant (an option, 0.8) for every layer, not the depth schedule 0.8 - 0.6 exp(-0.3 (l - 1))"),
            zoo.Departure("convention",
                          "num_heads counts differential heads (each a pair of half-width maps): to match an h-head Transformer use h / 2"),
            zoo.Departure("extension",
                          "biases on the query, key, value and output projections; the official code has none"),
            zoo.Departure("extension",
                          "a non-causal mode and any mask; the paper defines it in a causal decoder-only model"),
        ),
        factory=DifferentialAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=1),
        options={"lambda_init": 0.8},
        flops=flops,
        baselines={"stacked-call": stacked_call},
        best_known="stacked-call",
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="token", state_bytes=cache_bytes),
        targets=(
            zoo.Target("time-ratio", versus="torch-mha-layer", at_most=2.0, phase="fwd",
                       note="at most 2x nn.MultiheadAttention's forward"),
            zoo.Target("time-ratio", versus="torch-mha-layer", at_most=2.0, phase="fwd+bwd",
                       note="at most 2x nn.MultiheadAttention's fwd+bwd"),
        ),
    ))
