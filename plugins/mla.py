"""Multi-head latent attention (MLA, DeepSeek-V2): keys and values up-projected per head from one low-rank latent of
each token, ``c_t = x_t W_DKV`` (``kv_rank`` features), plus a decoupled rotary part: each head's query carries
``rope_dim`` rotary features and every token one rotary key shared by the heads,

    score_ij = (q_nope_i . (c_j W_UK) + RoPE(q_rope_i, i) . RoPE(k_rope_j, j)) / sqrt(d + rope_dim).

The forward builds the per-head keys and values and runs torch's fused SDPA on heads ``d + rope_dim`` wide. Decoding
caches only the latent and the rotary key (``kv_rank + rope_dim`` numbers per token, whatever the heads) and
attends in the absorbed form: the key up-projection folded into the query (``q_nope W_UK^T`` scores the latent
directly), the value up-projection applied after the weighted sum of latents; the explicit form over the same
cache, which up-projects every cached latent at every step, is timed beside it as a decoder baseline.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import cache_allowed, extend_cache, masked_sdpa, merge_heads, sdpa_zeroing_empty_rows, split_heads
from zoo.reference import linear, reference_mask, softmax_attention


def rotate(x, start: int, base: float):
    """RoPE, rotate-half convention, on (..., n, r) at positions start, start + 1, ...: features i and i + r/2
    turned by position * base^(-2i / r); the angles in float64, then the working dtype."""
    half, n = x.shape[-1] // 2, x.shape[-2]
    frequencies = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angles = (torch.arange(start, start + n, dtype=torch.float64, device=x.device).view(-1, 1) * frequencies)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class LatentAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, kv_rank: int = 256, rope_dim: int = 32,
                 rope_base: float = 10000.0):
        super().__init__()
        if isinstance(kv_rank, bool) or not isinstance(kv_rank, int) or kv_rank < 1:
            raise ValueError(f"kv_rank must be a positive integer, got {kv_rank!r}")
        if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim < 2 or rope_dim % 2:
            raise ValueError(f"rope_dim must be a positive even integer, got {rope_dim!r}")
        if isinstance(rope_base, bool) or not isinstance(rope_base, (int, float)) or not rope_base > 1:
            raise ValueError(f"rope_base must be a number above 1, got {rope_base!r}")
        self.d_model, self.num_heads, self.kv_rank, self.rope_dim = d_model, num_heads, kv_rank, rope_dim
        self.rope_base = float(rope_base)
        head = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * (head + rope_dim), bias=False)  # per head: [nope, rope]
        self.kv_down = nn.Linear(d_model, kv_rank, bias=False)  # W_DKV: the latent
        self.k_rope = nn.Linear(d_model, rope_dim, bias=False)  # W_KR: one rotary key per token
        self.k_up, self.v_up = (nn.Linear(kv_rank, d_model, bias=False) for _ in range(2))  # W_UK, W_UV
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        for layer in (self.q_proj, self.kv_down, self.k_rope, self.k_up, self.v_up, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)

    def queries(self, query, start: int = 0):
        """Per head (batch, heads, n, d) the content queries and (batch, heads, n, rope_dim) the rotated ones."""
        q = split_heads(self.q_proj(query), self.num_heads)
        nope, rope = q.split([q.shape[-1] - self.rope_dim, self.rope_dim], dim=-1)
        return nope, rotate(rope, start, self.rope_base)

    def latents(self, key, start: int = 0):
        """What a token keeps: its latent (batch, n, kv_rank) and its rotated rotary key (batch, n, rope_dim)."""
        return self.kv_down(key), rotate(self.k_rope(key), start, self.rope_base)

    def keys(self, latent, rotary):
        """Per head (batch, heads, n, d + rope_dim): the content key up-projected from the latent, then the rotary
        key every head shares."""
        h = self.num_heads
        return torch.cat([split_heads(self.k_up(latent), h), rotary.unsqueeze(1).expand(-1, h, -1, -1)], dim=-1)

    def padded_values(self, latent):
        """Per head the values up-projected from the latent, padded to the keys' width: one head width for all three
        keeps SDPA on its fused kernel."""
        return F.pad(split_heads(self.v_up(latent), self.num_heads), (0, self.rope_dim))

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        nope, rope = self.queries(query)
        latent, rotary = self.latents(key)
        out = masked_sdpa(torch.cat([nope, rope], dim=-1), self.keys(latent, rotary), self.padded_values(latent),
                          attn_mask, is_causal)
        return self.out_proj(merge_heads(out[..., :nope.shape[-1]]))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """The explicit form in float64: per-head keys and values up-projected from the latent, every rotary feature
    pair turned by its own 2 x 2 rotation matrix, softmax attention over the keys a query may see."""
    h, r, n = module.num_heads, module.rope_dim, query.shape[1]

    def heads(x):
        return x.unflatten(-1, (h, -1)).transpose(1, 2)

    q, latent = heads(linear(query, module.q_proj)), linear(key, module.kv_down)
    k_nope, v = heads(linear(latent, module.k_up)), heads(linear(latent, module.v_up))
    half = r // 2
    turns = torch.zeros(n, r, r, dtype=torch.float64)  # turns[p]: the rotation at position p
    for p in range(n):
        for i in range(half):
            angle = p * module.rope_base ** (-2.0 * i / r)
            c, s = math.cos(angle), math.sin(angle)
            turns[p, i, i], turns[p, i, i + half] = c, -s
            turns[p, i + half, i], turns[p, i + half, i + half] = s, c
    q_rope = torch.einsum("pij,bhpj->bhpi", turns, q[..., -r:])
    k_rope = torch.einsum("pij,bpj->bpi", turns, linear(key, module.k_rope))
    full_q = torch.cat([q[..., :-r], q_rope], dim=-1)
    full_k = torch.cat([k_nope, k_rope.unsqueeze(1).expand(-1, h, -1, -1)], dim=-1)
    mask = reference_mask(attn_mask, is_causal, n, n)
    out = softmax_attention(full_q, full_k, v, mask).transpose(1, 2).flatten(2)
    return linear(out, module.out_proj)


def decode(module, state, query, key, value, key_mask=None):
    """The next positions in the absorbed form: their latents and rotary keys cached, each head's content query
    moved into latent space by W_UK (``q_nope W_UK`` scores the cached latents directly, on SDPA with the latent as
    one key/value head), the rotary scores a logit bias, the weighted sum of latents moved out by W_UV. The value
    input is not read: keys and values both come from the key's latent."""
    h, t, rank = module.num_heads, query.shape[1], module.kv_rank
    nope, rope, state, before = _cached(module, state, query, key, key_mask)
    if t == 0:
        return query.new_zeros(query.shape), state
    head = nope.shape[-1]
    scale = 1.0 / math.sqrt(head + module.rope_dim)
    absorbed = nope @ module.k_up.weight.view(h, head, rank) * (scale * math.sqrt(rank))  # SDPA scales by 1/sqrt(rank)
    latents = state["latent"].unsqueeze(1)  # (batch, 1, total, kv_rank): one head every query head reads
    bias = rope @ state["rope"].unsqueeze(1).transpose(-1, -2) * scale
    allowed = cache_allowed(state, t, before, query.device)
    mixed = sdpa_zeroing_empty_rows(absorbed, latents, latents, allowed, enable_gqa=True, bias=bias)
    out = mixed @ module.v_up.weight.view(h, head, rank).transpose(-1, -2)  # (b, h, t, head)
    return module.out_proj(merge_heads(out)), state


def explicit_decode(module, state, query, key, value, key_mask=None):
    """A decoder baseline, the explicit form over the same cache: every step up-projects the keys and values of
    every cached latent per head (W_UK, W_UV), then attends over them as the forward does; the work the absorbed
    form saves, growing with the context at every step."""
    t = query.shape[1]
    nope, rope, state, before = _cached(module, state, query, key, key_mask)
    if t == 0:
        return query.new_zeros(query.shape), state
    k, v = module.keys(state["latent"], state["rope"]), module.padded_values(state["latent"])
    allowed = cache_allowed(state, t, before, query.device)
    out = sdpa_zeroing_empty_rows(torch.cat([nope, rope], dim=-1), k, v, allowed)
    return module.out_proj(merge_heads(out[..., :nope.shape[-1]])), state


def prefill(module, query, key, value, key_mask=None):
    """The prompt in the explicit form, as DeepSeek-V2 computes one: every position at once is compute-bound, and
    up-projecting its keys and values once costs less than scoring a rank-wide latent per head (the absorbed form
    also builds a rotary bias per head over every pair); its latents and rotary keys cached for the absorbed
    steps."""
    return explicit_decode(module, {}, query, key, value, key_mask)


def _cached(module, state, query, key, key_mask):
    """The new positions' content and rotated queries, and the cache with their latents and rotary keys appended
    (at their positions after those it held), and how many positions it held before: what both decodes do first."""
    start = state["latent"].shape[1] if "latent" in state else 0
    nope, rope = module.queries(query, start)
    latent, rotary = module.latents(key, start)
    state, before = extend_cache(state, {"latent": latent, "rope": rotary}, key_mask, sequence_dim=1)
    return nope, rope, state, before


def unpadded_values(module):
    """A baseline, MLA written plainly on torch SDPA: per-head keys [content, shared rotary] and values as they
    are (d wide under d + rope_dim wide queries and keys). The fastest form known here is the variant's own, which
    pads the values to the query width as DeepSeek's FlashAttention path does (torch's fused CPU kernel then
    takes the call)."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        nope, rope = module.queries(query)
        latent, rotary = module.latents(key)
        out = masked_sdpa(torch.cat([nope, rope], dim=-1), module.keys(latent, rotary),
                          split_heads(module.v_up(latent), module.num_heads), attn_mask, is_causal)
        return module.out_proj(merge_heads(out))

    return run


def cache_bytes(batch, context, d_model, num_heads, itemsize, kv_rank=256, rope_dim=32, **options):
    return batch * context * (kv_rank + rope_dim) * itemsize  # the latent and the rotary key, whatever the heads


def flops(batch, q_len, k_len, d_model, num_heads, kv_rank=256, rope_dim=32, **options):
    """The projections (queries with their rotary part, the latent, the rotary key, keys and values up from the
    latent, out) and attention on heads d + rope_dim wide (values padded to that width)."""
    projections = 2.0 * batch * (q_len * d_model * (d_model + num_heads * rope_dim) + q_len * d_model * d_model
                                 + k_len * d_model * (kv_rank + rope_dim) + 2 * k_len * kv_rank * d_model)
    return projections + 4.0 * batch * q_len * k_len * (d_model + num_heads * rope_dim)


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="mla",
        summary="Multi-head latent attention (DeepSeek-V2): keys and values from one low-rank latent, a decoupled "
                "rotary key; decodes from a cache of the latent and the rotary key.",
        family="softmax",
        citation="DeepSeek-AI 2024, DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model",
        departures=(
            zoo.Departure("omission", "no low-rank compression of the queries (as DeepSeek-V2-Lite) and no RMSNorm "
                                      "on the latent; no YaRN scaling of the rotary frequencies"),
            zoo.Departure("convention", "the latent and the rotary key read the key input and the value input is not "
                                        "read (keys and values share one latent); the rotary part rotate-half, "
                                        "base 10000; content heads d_model / heads wide; weights Xavier-uniform, "
                                        "no biases"),
        ),
        factory=LatentAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, key_order_invariant=False, allows_different_lengths=False),
        complexity=zoo.Complexity(time=2, memory=1),
        options={"kv_rank": 256, "rope_dim": 32, "rope_base": 10000.0},
        check_options={"kv_rank": 6, "rope_dim": 2},
        quality_options={"kv_rank": 32, "rope_dim": 8},
        baselines={"unpadded-values": unpadded_values},
        best_known="unpadded-values",
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=decode, growth="token", state_bytes=cache_bytes, baselines={
            "explicit-latent": zoo.Decoder(prefill=prefill, step=explicit_decode, growth="token",
                                           state_bytes=cache_bytes)}),
        targets=(
            zoo.Target("state-ratio", versus="mha-kv-cache", at_least=288 / 1024, at_most=288 / 1024, mode="causal",
                       phase="decode", note="at its defaults a cache of the latent (256) and the rotary key (32) per "
                                            "token: 288 numbers against multi-head's 2 x 512 keys and values"),
            zoo.Target("decode-ratio", versus="explicit-latent", at_most=1.0, mode="causal", phase="decode",
                       note="the absorbed decode faster than the explicit one over the same cache, at every timed "
                            "context and batch"),
        ),
    ))
