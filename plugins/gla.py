"""Gated linear attention (GLA, Yang et al. 2024): linear attention whose d x d state per head decays by a
data-dependent gate on each key feature,

    S_t = diag(alpha_t) S_(t-1) + k_t^T v_t,   o_t = RMSNorm(q_t S_t / sqrt(d)),

with ``alpha_t = sigmoid(x_t W_down W_up + b)^(1 / tau)`` (a low-rank gate, tau = 16 as in the paper) and each
head's output normalised (the paper's norm after attention, which also keeps an output of cancelling terms
well-conditioned: un-normalised linear attention's relative error grows as q . k cancels).

The fast path is the chunkwise form: across chunks each chunk's state, its keys decayed to the chunk's end, is
carried by a loop over chunks and read by the next chunk's queries decayed from its start (every exponent at most
0). Inside a chunk it takes the factorised form, as the fused chunk kernels do (queries times exp(b_i), keys times
exp(-b_j), one matmul per chunk), where every chunk's gates multiply to at least exp(-log(max) / 2) of the dtype
(e^-44 in float32), so no factor overflows or underflows; one flag is read back per call for that (a sync on a
GPU; a graph that torch.compile or torch.export captures takes the halving form throughout). A chunk whose gates
close further is computed by halving, exact whatever the gates, as the paper's
secondary-level chunking splits pairs once: the second half's queries against the first half's keys are one
matmul with both decayed to the last position of the first half (each factor at most 1), then each half again,
down to single positions (a chunk that is not a power of two is padded inside with positions that write nothing
and do not decay). Time and memory O(n chunk d). Decoding is the recurrence, the state in float32 at least.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import refuse_key_mask
from zoo.functional import merge_heads, split_heads
from zoo.reference import linear, segment_sums


class GatedLinearAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, gate_rank: int = 16, chunk: int = 32,
                 normalizer: float = 16.0):
        super().__init__()
        for label, value in (("gate_rank", gate_rank), ("chunk", chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if isinstance(normalizer, bool) or not isinstance(normalizer, (int, float)) or not normalizer > 0:
            raise ValueError(f"normalizer must be a positive number, got {normalizer!r}")
        self.d_model, self.num_heads, self.chunk, self.normalizer = d_model, num_heads, chunk, float(normalizer)
        self.eps = 1e-5
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=False)
                                                                for _ in range(4))
        for layer in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)
        self.gate_down = nn.Linear(d_model, gate_rank, bias=False)
        self.gate_up = nn.Linear(gate_rank, d_model)

    def project(self, query, key, value):
        """Per head (batch, heads, n, d): queries scaled by 1/sqrt(d), keys, values and the log gates, each
        position's gate read from its key input (the token written there)."""
        h = self.num_heads
        q, k, v = (split_heads(layer(x), h) for layer, x in ((self.q_proj, query), (self.k_proj, key),
                                                            (self.v_proj, value)))
        log_alpha = split_heads(F.logsigmoid(self.gate_up(self.gate_down(key))) / self.normalizer, h)
        return q / math.sqrt(q.shape[-1]), k, v, log_alpha

    def forward(self, query, key, value, attn_mask=None, is_causal=True):
        return self.output(chunkwise(*self.project(query, key, value), self.chunk, factorised_where_safe))

    def output(self, heads):
        """Each head's output RMS-normalised (no affine), the heads merged and projected."""
        return self.out_proj(merge_heads(F.rms_norm(heads, heads.shape[-1:], eps=self.eps)))


def _in_chunks(size, *tensors):
    """(batch, heads, n, d) tensors padded to whole chunks, as (batch, heads, chunks, size, d); padded positions
    write nothing (zero keys) and do not decay (log gate 0)."""
    pad = -tensors[0].shape[2] % size
    return [F.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, size)) for x in tensors]


def halving(q, k, v, within):
    """Inside chunks of a power-of-two size, ``sum_{j <= i} sum_f q_if k_jf exp(b_if - b_jf) v_j``: each pair
    (i, j) is taken once, at the split that separates them, decayed through the last position m of the first half
    as exp(b_i - b_m) exp(b_m - b_j), both exponents at most 0 since b falls along a chunk; a pair i = j has no
    decay."""
    size = q.shape[-2]
    out = (q * k).sum(-1, keepdim=True) * v
    half = size // 2
    while half >= 1:
        qs, ks, vs, bs = (x.unflatten(-2, (size // (2 * half), 2, half)) for x in (q, k, v, within))
        middle = bs[..., 0, -1:, :]
        later, earlier = qs[..., 1, :, :] * torch.exp(bs[..., 1, :, :] - middle), ks[..., 0, :, :] * torch.exp(
            middle - bs[..., 0, :, :])
        if half == 1:  # one query against one key: a dot product, not a matmul of ones
            across = (later * earlier).sum(-1, keepdim=True) * vs[..., 0, :, :]
        else:
            across = (later @ earlier.transpose(-1, -2)) @ vs[..., 0, :, :]
        out = out + F.pad(across.unsqueeze(-3), (0, 0, 0, 0, 1, 0)).flatten(-4, -2)  # to the second halves
        half //= 2
    return out


def factorised(q, k, v, within):
    """Inside chunks, ``(q exp(b)) (k exp(-b))^T`` masked to j <= i, times v: one matmul per chunk, as the fused
    chunk kernels compute it (exp(-b) grows as the gates close: it overflows where a chunk's gates multiply below
    about e^-88 in float32)."""
    size = q.shape[-2]
    scores = (q * torch.exp(within)) @ (k * torch.exp(-within)).transpose(-1, -2)
    return scores.masked_fill(~torch.ones(size, size, dtype=torch.bool, device=q.device).tril(), 0.0) @ v


def factorised_where_safe(within):
    """The inside form for these chunks: :func:`factorised` where no chunk's gates multiply below exp(-log(max) / 2)
    of the dtype (each factor then stays within exp(+-log(max) / 2)), else :func:`halving`; halving also where the
    gates cannot be read: on the meta device, or while torch.compile or torch.export traces the graph (a value read
    back would break it, and the graph must hold for any gates)."""
    if within.is_meta or torch.compiler.is_compiling():
        return halving
    limit = math.log(torch.finfo(within.dtype).max) / 2
    return factorised if bool((within[..., -1, :] >= -limit).all()) else halving


def chunkwise(q, k, v, log_alpha, size, inside):
    """The chunkwise form on (batch, heads, n, d) inputs; ``inside(q, k, v, within)`` gives each chunk's own
    contribution (``halving`` needs a power-of-two size: a chunk of another size is padded inside to one), or
    ``factorised_where_safe`` chooses it from the gates."""
    n = q.shape[2]
    if n == 0:
        return v * 0.0  # no chunks, and an output still in the graph
    q, k, v, log_alpha = _in_chunks(size, q, k, v, log_alpha)
    within = log_alpha.cumsum(dim=-2)  # b_i: the log of the gates' product from the chunk's start to i
    if inside is factorised_where_safe:
        inside = factorised_where_safe(within.detach())
    if inside is halving and size & (size - 1):
        q, k, v, log_alpha = (F.pad(x, (0, 0, 0, (1 << size.bit_length()) - size)) for x in (q, k, v, log_alpha))
        within = log_alpha.cumsum(dim=-2)
    local = inside(q, k, v, within)
    states = (k * torch.exp(within[..., -1:, :] - within)).transpose(-1, -2) @ v  # (b, h, c, d, d_v)
    carry = torch.exp(within[..., -1, :]).unsqueeze(-1)  # (b, h, c, d, 1): a whole chunk's decay per key feature
    state, entering = torch.zeros_like(states[:, :, 0]), []
    for chunk_state, decay in zip(states.unbind(2), carry.unbind(2)):  # views taken at once (see retention)
        entering.append(state)
        state = decay * state + chunk_state
    earlier = (q * torch.exp(within)) @ torch.stack(entering, dim=2)
    return (local + earlier)[..., :size, :].flatten(2, 3)[:, :, :n]


def reference(module, query, key, value, attn_mask=None, is_causal=True):
    """The parallel form in float64: o_t = sum_{s <= t} sum_f q_tf k_sf exp(sum of log alpha_lf over l = s+1..t)
    v_s / sqrt(d), each decay summed over an explicit indicator of the positions between; each head normalised."""
    h, n = module.num_heads, query.shape[1]

    def heads(x):
        return x.unflatten(-1, (h, -1)).transpose(1, 2)

    q, k, v = (heads(linear(x, layer))
               for x, layer in ((query, module.q_proj), (key, module.k_proj), (value, module.v_proj)))
    log_alpha = heads(F.logsigmoid(linear(linear(key, module.gate_down), module.gate_up)) / module.normalizer)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    decay = torch.exp(segment_sums(log_alpha.transpose(-1, -2))).permute(0, 1, 3, 4, 2) * causal.double()[..., None]
    scores = torch.einsum("bhtf,bhsf,bhtsf->bhts", q, k, decay) / math.sqrt(q.shape[-1])
    out = scores @ v
    out = out / torch.sqrt((out ** 2).mean(-1, keepdim=True) + module.eps)  # each head RMS-normalised
    return linear(out.transpose(1, 2).flatten(2), module.out_proj)



def prefill(module, query, key, value, key_mask=None):
    """The chunkwise forward over the prompt, and its state S_p = sum_s diag(prod of alpha over s+1..p) k_s^T v_s."""
    refuse_key_mask("gla", key_mask)
    dtype = torch.promote_types(query.dtype, torch.float32)
    q, k, v, log_alpha = module.project(*(x.to(dtype) for x in (query, key, value)))
    out = module.output(chunkwise(q, k, v, log_alpha, module.chunk, factorised_where_safe)).to(query.dtype)
    later = log_alpha.flip(2).cumsum(2).flip(2) - log_alpha  # sum of log alpha over s+1..p, per position s
    return out, {"state": (k * torch.exp(later)).transpose(-1, -2) @ v}


def step(module, state, query, key, value, key_mask=None):
    """The next token: S_t = diag(alpha_t) S_(t-1) + k_t^T v_t in place, o_t = RMSNorm(q_t S_t / sqrt(d))."""
    refuse_key_mask("gla", key_mask)
    s = state["state"]
    q, k, v, log_alpha = module.project(*(x.to(s.dtype) for x in (query, key, value)))
    s.mul_(torch.exp(log_alpha).transpose(-1, -2)).add_(k.transpose(-1, -2) @ v)
    return module.output(q @ s).to(query.dtype), state


def state_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return batch * d_model * (d_model // num_heads) * max(itemsize, 4)  # a d x d state per head, float32 at least


def recurrent(module):
    """A baseline: the recurrence token by token, as the model decodes (a Python loop over positions)."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        q, k, v, log_alpha = module.project(query, key, value)
        state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
        outputs = []
        for t in range(q.shape[2]):
            state = torch.exp(log_alpha[:, :, t]).unsqueeze(-1) * state + k[:, :, t, :, None] * v[:, :, t, None]
            outputs.append(q[:, :, t, None] @ state)
        out = torch.cat(outputs, dim=2) if outputs else v * 0.0
        return module.output(out)

    return run


def factorised_chunks(module):
    """A baseline: the chunkwise form with each chunk's scores as one matmul of rescaled queries and keys."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        return module.output(chunkwise(*module.project(query, key, value), module.chunk, factorised))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, gate_rank=16, chunk=32, **options):
    """The projections (q, k, v, out and the low-rank gate), and the chunkwise form's matmuls with the factorised
    form inside chunks (what gates that stay open take): per head and chunk, the scores and their product with
    the values (2 chunk^2 (d + d_v)), the chunk states and their reads. The decays are elementwise, which a FLOP
    counter does not count. (Gates that close a chunk beyond the factorised form's range take the halving form
    instead, on chunks padded to a power of two p: p (p - 2) (d + d_v) inside.)"""
    chunks = -(-q_len // chunk)
    projections = 2.0 * batch * q_len * (4 * d_model * d_model + 2 * d_model * gate_rank)
    inside = 4.0 * d_model * chunk * chunk
    return projections + batch * chunks * (inside + 4.0 * chunk * d_model * (d_model // num_heads))


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="gla",
        summary="Gated linear attention: a d x d state per head decayed by a data-dependent gate per key feature, "
                "chunkwise.",
        family="linear",
        citation="Yang, Wang, Shen, Panda & Kim 2024, Gated Linear Attention Transformers with Hardware-Efficient "
                 "Training (ICML)",
        departures=(
            zoo.Departure("omission", "the attention core and its per-head output norm only: no swish output gate "
                                      "and no short convolution"),
            zoo.Departure("substitution", "the per-head norm is RMSNorm without affine (the reference code, "
                                          "flash-linear-attention, has a learned weight)"),
            zoo.Departure("convention", "keys as wide as values (the paper halves the key width, expand_k = 0.5); "
                                        "the gate reads the key input (the token written at t); projections "
                                        "Xavier-uniform without biases"),
        ),
        factory=GatedLinearAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, causal_only=True, accepts_attn_mask=False, allows_different_lengths=False,
                      key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"gate_rank": 16, "chunk": 32, "normalizer": 16.0},
        check_options={"gate_rank": 3, "chunk": 4},
        baselines={"recurrent": recurrent, "factorised-chunks": factorised_chunks},
        best_known="factorised-chunks",
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="fixed", state_bytes=state_bytes),
        targets=(
            zoo.Target("time-ratio", versus="recurrent", at_most=1 / 10, mode="causal", phase="fwd+bwd", n=4096,
                       note="at least 10x faster than its token-by-token recurrence (judged on the long board: the "
                            "quick profile leaves the recurrence out)"),
            zoo.Target("decode-growth", at_least=1 / 1.1, at_most=1.1, mode="causal", phase="decode",
                       note="time per generated token constant within 10% from the shortest timed context to the longest"),
        ),
    ))
