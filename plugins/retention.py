"""Retention (RetNet, Sun et al. 2023): attention without softmax, where key m's weight for query n decays
as gamma^(n - m), with one decay per head (gamma_h = 1 - 2^(-5 - h) for heads h = 0, 1, ..., as RetNet gives
it), each head's output normalised:

    o_n = RMSNorm( sum_{m <= n} gamma^(n - m) (q_n . k_m / sqrt(d)) v_m )

(the paper writes GroupNorm; its reference code, torchscale, uses RMSNorm without affine, which also avoids
the mean subtraction that cancels digits when a head is narrow).

It has three equal forms: parallel (the n x n decay matrix), recurrent (a d x d state, one token at a
time) and chunked (the fast path here: the parallel form inside chunks, the recurrent one across them),
so causal retention costs O(n d^2). The recurrent form is the float64 reference and the parallel form a
baseline, so the correctness suite checks that all three agree. Without ``is_causal`` the decay runs both ways, gamma^|n - m|
(bidirectional retention as in RMT, Fan et al. 2024): one causal pass each way, minus the diagonal
counted twice. Retention has no attention mask (a query-dependent mask would break the chunked form),
and query and key positions are the same sequence. Decoding is the recurrent form, the d x d state per head
kept in float32 at least (for the decays' sake, as ``decays`` says).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import refuse_key_mask
from zoo.functional import merge_heads, split_heads


def decays(num_heads: int, device=None, dtype=torch.float32):
    """RetNet's per-head decay, gamma_h = 1 - 2^(-5 - h) for heads h = 0, 1, ... (a (heads, 1, 1) tensor), in
    float32 at least: in half precision 1 - 2^-12 rounds to 1, and its powers would never decay (float32 keeps
    them apart up to 20 heads)."""
    dtype = torch.promote_types(dtype, torch.float32)
    exponents = 5.0 + torch.arange(num_heads, dtype=torch.float64)
    return (1 - 2.0 ** -exponents).to(device=device, dtype=dtype).view(num_heads, 1, 1)


MATRIX_CHUNKS = 32
"""The default ``matrix_chunks``: up to this many chunks, the states entering them come from one (chunks x chunks)
matrix product; beyond it, from a loop over the chunks. The product's work grows with chunks squared and the loop's
cost is its per-chunk ops: timed side by side on a 2-core CPU (d_model 512, 8 heads, chunk 64, fwd+bwd), the
product was the faster at 16 chunks, the two level at 32 and 64, the loop the faster from 128; where they level,
the loop does fewer FLOPs. Another machine may cross elsewhere: the module takes it as an option."""


def causal_chunked(q, k, v, gamma, chunk: int, matrix_chunks: int):
    """sum_{m <= n} gamma^(n - m) q_n . k_m v_m on (batch, heads, seq, d): the parallel form within chunks and
    a decayed d x d state across them, the states entering the chunks found by :func:`entering_states`."""
    batch, heads, n, width = q.shape
    if n == 0:
        return v * 0.0  # no chunks, and an output still in the graph
    chunks = -(-n // chunk)
    pad = chunks * chunk - n
    if pad:  # zero keys and values add nothing
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    q, k, v = (x.reshape(batch, heads, chunks, chunk, x.shape[-1]) for x in (q, k, v))
    position = torch.arange(chunk, device=q.device, dtype=gamma.dtype)  # powers of gamma in gamma's precision
    offsets = position.view(-1, 1) - position.view(1, -1)
    inside = torch.where(offsets >= 0, gamma.unsqueeze(2) ** offsets.clamp(min=0), 0.0).to(q.dtype)  # (h, 1, c, c)
    local = ((q @ k.transpose(-2, -1)) * inside) @ v
    # each chunk's keys, decayed to the chunk's end; then the state entering each chunk
    kv = (k * (gamma.unsqueeze(2) ** (chunk - 1 - position).view(-1, 1)).to(k.dtype)).transpose(-2, -1) @ v
    entering = entering_states(kv, gamma, chunk, matrix_chunks)
    earlier = (q * (gamma.unsqueeze(2) ** (position + 1).view(-1, 1)).to(q.dtype)) @ entering
    return (local + earlier).reshape(batch, heads, chunks * chunk, v.shape[-1])[:, :, :n]


def entering_states(kv, gamma, chunk: int, matrix_chunks: int):
    """The state entering chunk c, sum_{c' < c} gamma^(chunk (c - 1 - c')) kv_c', for every chunk at once:
    ``kv`` (batch, heads, chunks, d, d_v) holds each chunk's keys decayed to its end times its values."""
    chunks = kv.shape[2]
    if chunks <= matrix_chunks:
        steps = torch.arange(chunks, device=kv.device, dtype=gamma.dtype)
        apart = steps.view(-1, 1) - steps.view(1, -1)  # c - c'
        across = torch.where(apart >= 1, gamma ** (chunk * (apart - 1)).clamp(min=0), 0.0).to(kv.dtype)  # (h, c, c)
        return (across @ kv.flatten(3)).view_as(kv)
    carry = (gamma ** chunk).to(kv.dtype)  # (heads, 1, 1)
    state, entering = torch.zeros_like(kv[:, :, 0]), []
    for chunk_kv in kv.unbind(2):  # views taken at once: indexing kv per chunk made autograd's backward build a
        entering.append(state)  # full-size zero gradient per chunk (cost growing with chunks squared)
        state = carry * state + chunk_kv
    return torch.stack(entering, dim=2)


class Retention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, chunk: int = 64, eps: float = 1e-6,
                 matrix_chunks: int = MATRIX_CHUNKS):
        super().__init__()
        for label, value, least in (("chunk", chunk, 1), ("matrix_chunks", matrix_chunks, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{label} must be an integer >= {least}, got {value!r}")
        self.d_model, self.num_heads, self.chunk, self.eps = d_model, num_heads, chunk, eps
        self.matrix_chunks = matrix_chunks

    def heads(self, query, key, value):
        h = self.num_heads
        q, k, v = (split_heads(x, h) for x in (query, key, value))
        return q / math.sqrt(q.shape[-1]), k, v, decays(h, q.device, q.dtype)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v, gamma = self.heads(query, key, value)
        out = causal_chunked(q, k, v, gamma, self.chunk, self.matrix_chunks)
        if not is_causal:  # the same pass from the end, minus the diagonal both passes counted
            backward = causal_chunked(q.flip(2), k.flip(2), v.flip(2), gamma, self.chunk, self.matrix_chunks).flip(2)
            out = out + backward - (q * k).sum(dim=-1, keepdim=True) * v
        return merge_heads(F.rms_norm(out, out.shape[-1:], eps=self.eps))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """The recurrent form in float64, as RetNet decodes: one token at a time, S_t = gamma S_(t-1) + k_t^T v_t
    and o_t = q_t S_t (and the same from the end, minus the diagonal counted twice, without is_causal)."""
    h = module.num_heads
    q, k, v = (x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value))
    q = q / math.sqrt(q.shape[-1])
    gamma = torch.tensor([1 - 2.0 ** (-5 - head) for head in range(h)], dtype=torch.float64).view(h, 1, 1)

    def scan(q, k, v):
        state = torch.zeros(q.shape[0], h, q.shape[-1], v.shape[-1], dtype=torch.float64)
        outputs = []
        for t in range(q.shape[2]):
            state = gamma * state + torch.einsum("bhi,bhj->bhij", k[:, :, t], v[:, :, t])
            outputs.append(torch.einsum("bhi,bhij->bhj", q[:, :, t], state))
        return torch.stack(outputs, dim=2) if outputs else v.new_zeros(*v.shape)

    out = scan(q, k, v)
    if not is_causal:
        out = out + scan(q.flip(2), k.flip(2), v.flip(2)).flip(2) - (q * k).sum(-1, keepdim=True) * v
    out = out / torch.sqrt((out ** 2).mean(-1, keepdim=True) + module.eps)
    return out.transpose(1, 2).flatten(2)



def prefill(module, query, key, value, key_mask=None):
    """The causal forward over the prompt, and its recurrent state S_p = sum_m gamma^(p - 1 - m) k_m^T v_m."""
    refuse_key_mask("retention", key_mask)
    dtype = torch.promote_types(query.dtype, torch.float32)
    q, k, v, gamma = module.heads(*(x.to(dtype) for x in (query, key, value)))
    length = k.shape[2]
    if length:
        out = causal_chunked(q, k, v, gamma, module.chunk, module.matrix_chunks)
        out = merge_heads(F.rms_norm(out, out.shape[-1:], eps=module.eps)).to(query.dtype)
    else:  # the chunked form has no chunk to start from
        out = query.new_zeros(query.shape)
    age = torch.arange(length - 1, -1, -1, device=k.device, dtype=gamma.dtype)  # p - 1 - m
    state = (k * (gamma ** age.view(-1, 1))).transpose(-2, -1) @ v
    return out, {"state": state}


def step(module, state, query, key, value, key_mask=None):
    """The next token: S_t = gamma S_(t-1) + k_t^T v_t in place, o_t = RMSNorm(q_t S_t / sqrt(d)) per head."""
    refuse_key_mask("retention", key_mask)
    s = state["state"]
    q, k, v, gamma = module.heads(*(x.to(s.dtype) for x in (query, key, value)))
    s.mul_(gamma).addcmul_(k.transpose(-2, -1), v)
    out = q @ s
    return merge_heads(F.rms_norm(out, out.shape[-1:], eps=module.eps)).to(query.dtype), state


def state_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return batch * d_model * (d_model // num_heads) * max(itemsize, 4)  # a d x d state per head, float32 at least


def parallel(module):
    """A baseline: the parallel form RetNet trains with, (q k^T * D) v with the n x n decay matrix
    D[n, m] = gamma^|n - m| (zero above the diagonal when causal)."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v, gamma = module.heads(query, key, value)
        position = torch.arange(q.shape[2], device=q.device, dtype=gamma.dtype)
        offsets = position.view(-1, 1) - position.view(1, -1)
        decay = gamma ** offsets.abs()
        if is_causal:
            decay = decay.masked_fill(offsets < 0, 0.0)
        out = ((q @ k.transpose(-2, -1)) * decay.to(q.dtype)) @ v
        return merge_heads(F.rms_norm(out, out.shape[-1:], eps=module.eps))

    return run


def decay_matrix_scan(module):
    """The chunkwise form with no loop: the states entering all chunks at once, as one (chunks x chunks) matrix of
    chunk-to-chunk decays gamma^(chunk (c - c' - 1)) (c' < c) times every chunk's decayed key-value product."""

    def causal(q, k, v, gamma, size):
        batch, heads, n, width = q.shape
        chunks = -(-n // size)
        if n == 0:
            return v * 0.0
        q, k, v = (F.pad(x, (0, 0, 0, chunks * size - n)).unflatten(2, (chunks, size)) for x in (q, k, v))
        position = torch.arange(size, device=q.device, dtype=gamma.dtype)
        offsets = position.view(-1, 1) - position.view(1, -1)
        g = gamma.unsqueeze(2)  # (heads, 1, 1, 1)
        local = ((q @ k.transpose(-2, -1)) * torch.where(offsets >= 0, g ** offsets.clamp(min=0), 0.0).to(q.dtype)) @ v
        kv = (k * (g ** (size - 1 - position).view(-1, 1)).to(k.dtype)).transpose(-2, -1) @ v  # (b, h, c, d, d_v)
        steps = torch.arange(chunks, device=q.device, dtype=gamma.dtype)
        apart = steps.view(-1, 1) - steps.view(1, -1)  # c - c'
        across = torch.where(apart >= 1, gamma ** (size * (apart - 1)).clamp(min=0), 0.0).to(q.dtype)  # (h, c, c)
        entering = (across @ kv.flatten(3)).view_as(kv)
        earlier = (q * (g ** (position + 1).view(-1, 1)).to(q.dtype)) @ entering
        return (local + earlier).flatten(2, 3)[:, :, :n]

    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v, gamma = module.heads(query, key, value)
        out = causal(q, k, v, gamma, module.chunk)
        if not is_causal:
            out = out + causal(q.flip(2), k.flip(2), v.flip(2), gamma, module.chunk).flip(2) - (q * k).sum(-1, keepdim=True) * v
        return merge_heads(F.rms_norm(out, out.shape[-1:], eps=module.eps))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, chunk=64, matrix_chunks=MATRIX_CHUNKS, **options):
    """The chunked form's matmuls, without is_causal (one pass each way): per pass, q k^T and its product
    with v inside chunks (4 n chunk d_model) and the chunk states and their reads (4 n d_model d_head),
    on the sequence padded to whole chunks; up to ``matrix_chunks`` chunks, the (chunks x chunks) product
    that sums the states (2 chunks^2 d_model d_head)."""
    chunks = -(-q_len // chunk)
    padded, d_head = chunks * chunk, d_model // num_heads
    across = 2.0 * chunks * chunks * d_model * d_head if chunks <= matrix_chunks else 0.0
    return 2 * batch * (4.0 * padded * chunk * d_model + 4.0 * padded * d_model * d_head + across)


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="retention",
        summary="RetNet retention: decayed linear attention per head, chunked (parallel inside, recurrent across).",
        family="linear",
        citation="Sun et al. 2023, Retentive Network: A Successor to Transformer for Large Language Models",
        departures=(
            zoo.Departure("omission",
                          "no xPos rotation of queries and keys (RetNet's Theta): positions enter only through the decay"),
            zoo.Departure("omission",
                          "no swish gate or output projection of gated multi-scale retention; values are as wide as keys (RetNet: 2x)"),
            zoo.Departure("substitution", "RMSNorm without affine per head in place of GroupNorm (as torchscale does)"),
            zoo.Departure("omission",
                          "the paper's retention-score normalisations are left out (per-row scalings the RMSNorm cancels but for its eps)"),
            zoo.Departure("extension",
                          "without is_causal, bidirectional retention gamma^|n - m| (as in RMT, Fan et al. 2024); RetNet is causal only"),
        ),
        factory=Retention,
        reference=reference,
        tags=zoo.Tags(accepts_attn_mask=False, allows_different_lengths=False, key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"chunk": 64, "matrix_chunks": MATRIX_CHUNKS},
        check_options={"chunk": 4, "matrix_chunks": 2},  # the small cases take both ways of summing chunk states
        baselines={"parallel": parallel, "decay-matrix-scan": decay_matrix_scan},
        best_known="decay-matrix-scan",
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="fixed", state_bytes=state_bytes),
        targets=(
            zoo.Target("decode-growth", at_least=1 / 1.1, at_most=1.1, mode="causal", phase="decode",
                       note="time per generated token constant within 10% from the shortest timed context to the longest"),
            zoo.Target("decode-ratio", versus="sdpa-kv-cache", at_most=0.1, mode="causal", phase="decode", n=16384,
                       note="at least 10x faster per token than softmax over a KV cache at 16384 context"),
            zoo.Target("time-ratio", versus="torch-sdpa", at_most=1 / 10, mode="causal", phase="fwd", n=16384,
                       note="causal: at least 10x faster than causal torch SDPA at n=16384, as linear attention is"),
        ),
    ))
