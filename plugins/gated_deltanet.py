"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025): linear attention whose state is corrected by the delta rule
and decayed by a data-dependent scalar gate per head,

    S_t = alpha_t (I - beta_t k_t k_t^T) S_(t-1) + beta_t k_t v_t^T,   o_t = RMSNorm(S_t^T q_t / sqrt(d)),

with q and k L2-normalised per head after a SiLU, ``beta_t = sigmoid(w_b . x_t)`` the writing strength and
``alpha_t = exp(-exp(A_log) softplus(w_a . x_t + dt_bias))`` the decay (Mamba-2's parametrisation, as the paper's).
Each write first removes what the state held for k_t (``u_t = beta_t (v_t - alpha_t S_(t-1)^T k_t)``), then adds
``k_t u_t^T``: memory that overwrites instead of piling up.

The fast path is the chunkwise form with the UT transform: inside a chunk of C tokens the new values u solve the
lower-triangular system ``(I + tril(diag(beta) (Gamma * K K^T), -1)) u = beta (V - gamma K S_0)``, where Gamma_ts =
gamma_t / gamma_s is the decay from s to t (every exponent at most 0); one batched triangular solve per chunk
gives ``W = T diag(beta gamma) K`` and ``U = T diag(beta) V``, so that ``u = U - W S_0`` once the entering state
is known. A loop over chunks carries the state with matmuls only (O(n C d + n d^2) time, linear in n). Decoding
is the recurrence, the state in float32 at least.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import refuse_key_mask
from zoo.functional import merge_heads, split_heads
from zoo.reference import linear


class GatedDeltaNet(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, chunk: int = 64):
        super().__init__()
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        self.d_model, self.num_heads, self.chunk = d_model, num_heads, chunk
        self.eps = 1e-5
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=False)
                                                                for _ in range(4))
        for layer in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)
        self.b_proj = nn.Linear(d_model, num_heads, bias=False)
        self.a_proj = nn.Linear(d_model, num_heads, bias=False)
        # as the paper's code: A = U(0, 16), softplus(dt_bias) log-uniform in [0.001, 0.1] at the start
        dt = torch.exp(torch.empty(num_heads).uniform_(math.log(1e-3), math.log(1e-1))).clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(0, 16).clamp_min(1e-4).log())

    def project(self, query, key, value):
        """Per head (batch, heads, n, d): L2-normalised queries scaled by 1/sqrt(d), L2-normalised keys, values;
        per head (batch, heads, n): the writing strength beta and the log decay, both read from the key input
        (the token written at t). All in float32 at least after the input projections, as the paper's kernels
        compute: in bfloat16, the rounding of q through SiLU, the norm and the scale took one case's output to
        twice plain torch's error of the recurrence."""
        h, work = self.num_heads, torch.promote_types(query.dtype, torch.float32)
        q, k = (F.normalize(split_heads(F.silu(layer(x).to(work)), h), dim=-1)
                for layer, x in ((self.q_proj, query), (self.k_proj, key)))
        v = split_heads(F.silu(self.v_proj(value).to(work)), h)
        beta = torch.sigmoid(self.b_proj(key).to(work)).transpose(1, 2)
        log_alpha = (-torch.exp(self.A_log.to(work)) * F.softplus(self.a_proj(key).to(work) + self.dt_bias.to(work))
                     ).transpose(1, 2)
        return q / math.sqrt(q.shape[-1]), k, v, beta, log_alpha

    def forward(self, query, key, value, attn_mask=None, is_causal=True):
        return self.output(chunkwise(*self.project(query, key, value), self.chunk, ut_transform)[0])

    def output(self, heads):
        """Each head's output RMS-normalised (no affine, in the heads' precision), the heads merged and projected."""
        normed = F.rms_norm(heads, heads.shape[-1:], eps=self.eps).to(self.out_proj.weight.dtype)
        return self.out_proj(merge_heads(normed))


def decays(within, diagonal):
    """(..., C) -> (..., C, C): the decay exp(within_t - within_s) from s to t for s <= t + ``diagonal``, 0 elsewhere;
    the exponents above are masked before exp, so none overflows (an overflowed exp times zero is a NaN gradient)."""
    size = within.shape[-1]
    later = ~torch.ones(size, size, dtype=torch.bool, device=within.device).tril(diagonal)
    return torch.exp((within.unsqueeze(-1) - within.unsqueeze(-2)).masked_fill(later, float("-inf")))


def ut_transform(k, values, beta, within):
    """Inside each chunk, ``(I + tril(diag(beta) (Gamma * K K^T), -1))^(-1) diag(beta) [V, gamma K]`` by one
    batched triangular solve (the UT transform): the values to write and the keys that read the entering state.
    The solve runs in float32 at least (as the paper's kernels do; torch has no half-precision one on the CPU)."""
    size, work = k.shape[-2], torch.promote_types(k.dtype, torch.float32)
    gamma = decays(within, -1)
    system = (k @ k.transpose(-1, -2)) * gamma * beta.unsqueeze(-1) + torch.eye(size, dtype=k.dtype, device=k.device)
    solved = torch.linalg.solve_triangular(system.to(work), (beta.unsqueeze(-1) * values).to(work), upper=False,
                                           unitriangular=True)
    return solved.to(k.dtype)


def substitution(k, values, beta, within):
    """The same system solved row by row (forward substitution over the chunk's positions), as the reference
    chunk code of flash-linear-attention writes it: C small matmuls per chunk instead of one solve."""
    size = k.shape[-2]
    gamma = decays(within, -1)
    lower = (k @ k.transpose(-1, -2)) * gamma * beta.unsqueeze(-1)
    right = beta.unsqueeze(-1) * values
    rows = []
    for t in range(size):
        solved = torch.stack(rows, dim=-2) if rows else right[..., :0, :]
        rows.append(right[..., t, :] - (lower[..., t, None, :t] @ solved).squeeze(-2))
    return torch.stack(rows, dim=-2)


def chunkwise(q, k, v, beta, log_alpha, size, solve, state=None):
    """The chunkwise form on (batch, heads, n, d) inputs; ``solve(k, values, beta, within)`` applies the chunks'
    UT transform. Returns the outputs and the state after the last token, (batch, heads, d_k, d_v)."""
    batch, heads, n, width = k.shape
    if state is None:
        state = v.new_zeros(batch, heads, width, v.shape[-1])
    if n == 0:
        return v * 0.0, state  # no chunks, and an output still in the graph
    pad = -n % size  # padded positions write nothing (beta 0, zero keys) and do not decay (log alpha 0)
    q, k, v = (F.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, size)) for x in (q, k, v))
    beta, log_alpha = (F.pad(x, (0, pad)).unflatten(2, (-1, size)) for x in (beta, log_alpha))
    within = log_alpha.cumsum(dim=-1)  # log gamma_t: the decay from the chunk's start to t
    gamma = torch.exp(within).unsqueeze(-1)
    solved = solve(k, torch.cat([v, gamma * k], dim=-1), beta, within)
    values, readers = solved[..., :v.shape[-1]], solved[..., v.shape[-1]:]  # U and W
    scores = (q @ k.transpose(-1, -2)) * decays(within, 0)
    to_end = (k * torch.exp(within[..., -1:] - within).unsqueeze(-1)).transpose(-1, -2)  # decay from s to the end
    carry = torch.exp(within[..., -1]).unsqueeze(-1).unsqueeze(-1)
    outputs = []
    for q_c, gamma_c, scores_c, values_c, readers_c, to_end_c, carry_c in zip(
            *(x.unbind(2) for x in (q, gamma, scores, values, readers, to_end, carry))):  # views taken at once
        new = values_c - readers_c @ state  # u = U - W S_0
        outputs.append((gamma_c * q_c) @ state + scores_c @ new)
        state = carry_c * state + to_end_c @ new
    return torch.stack(outputs, dim=2).flatten(2, 3)[:, :, :n], state


def reference(module, query, key, value, attn_mask=None, is_causal=True):
    """The paper's recurrence in float64, as written: S_t = alpha_t (I - beta_t k_t k_t^T) S_(t-1) + beta_t k_t v_t^T
    with the d x d matrices built explicitly, o_t = S_t^T q_t / sqrt(d); each head normalised."""
    h = module.num_heads

    def heads(x):
        return x.unflatten(-1, (h, -1)).transpose(1, 2)

    q = heads(F.silu(linear(query, module.q_proj)))
    k = heads(F.silu(linear(key, module.k_proj)))
    q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True)).clamp_min(1e-12) for x in (q, k))
    v = heads(F.silu(linear(value, module.v_proj)))
    beta = torch.sigmoid(linear(key, module.b_proj)).transpose(1, 2)
    alpha = torch.exp(-torch.exp(module.A_log) * F.softplus(linear(key, module.a_proj) + module.dt_bias)).transpose(1, 2)
    batch, _, n, d = k.shape
    eye = torch.eye(d, dtype=k.dtype)
    state = q.new_zeros(batch, h, d, v.shape[-1])
    out = q.new_zeros(batch, h, n, v.shape[-1])
    for t in range(n):
        k_t, b_t, a_t = k[:, :, t, :, None], beta[:, :, t, None, None], alpha[:, :, t, None, None]
        state = a_t * (eye - b_t * k_t @ k_t.transpose(-1, -2)) @ state + b_t * k_t @ v[:, :, t, None, :]
        out[:, :, t] = (state.transpose(-1, -2) @ q[:, :, t, :, None]).squeeze(-1) / math.sqrt(d)
    out = out / torch.sqrt((out ** 2).mean(-1, keepdim=True) + module.eps)  # each head RMS-normalised
    return linear(out.transpose(1, 2).flatten(2), module.out_proj)


def prefill(module, query, key, value, key_mask=None):
    """The chunkwise forward over the prompt, and the state it leaves (float32 at least)."""
    refuse_key_mask("gated-deltanet", key_mask)
    out, state = chunkwise(*module.project(query, key, value), module.chunk, ut_transform)
    return module.output(out).to(query.dtype), {"state": state}


def step(module, state, query, key, value, key_mask=None):
    """The next token, in place: S <- alpha S, u = beta (v - S^T k), S <- S + k u^T, o = RMSNorm(S^T q)."""
    refuse_key_mask("gated-deltanet", key_mask)
    s = state["state"]
    q, k, v, beta, log_alpha = module.project(query, key, value)
    s.mul_(torch.exp(log_alpha).unsqueeze(-1))
    new = beta.unsqueeze(-1) * (v - k @ s)
    s.add_(k.transpose(-1, -2) @ new)
    return module.output(q @ s).to(query.dtype), state


def state_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return batch * d_model * (d_model // num_heads) * max(itemsize, 4)  # a d x d state per head, float32 at least


def recurrent(module):
    """A baseline: the delta rule token by token, as the model decodes (a Python loop over positions)."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        q, k, v, beta, log_alpha = module.project(query, key, value)
        state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
        outputs = []
        for t in range(q.shape[2]):
            state = torch.exp(log_alpha[:, :, t, None, None]) * state
            k_t = k[:, :, t, None]
            state = state + k_t.transpose(-1, -2) @ (beta[:, :, t, None, None] * (v[:, :, t, None] - k_t @ state))
            outputs.append(q[:, :, t, None] @ state)
        out = torch.cat(outputs, dim=2) if outputs else v * 0.0
        return module.output(out)

    return run


def substitution_chunks(module):
    """A baseline: the chunkwise form with each chunk's UT transform by row-by-row forward substitution."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        return module.output(chunkwise(*module.project(query, key, value), module.chunk, substitution)[0])

    return run


def flops(batch, q_len, k_len, d_model, num_heads, chunk=64, **options):
    """The projections (q, k, v, out and the two per-head gates), and the chunkwise form's matmuls on the
    sequence padded to whole chunks: K K^T and Q K^T in each chunk, the chunk scores times the new values, and
    per chunk the reads and writes of the state (W S, Q S, K^T u). The triangular solve (C^2 (d_k + d_v) per
    chunk per head) and the elementwise decays are not matmuls, which a FLOP counter does not count."""
    padded = -(-q_len // chunk) * chunk
    head = d_model // num_heads
    projections = 2.0 * batch * q_len * (4 * d_model * d_model + 2 * d_model * num_heads)
    return projections + 2.0 * batch * padded * (3 * chunk * d_model + 3 * d_model * head)


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="gated-deltanet",
        summary="Gated DeltaNet: a d x d state per head written by the delta rule and decayed by a data-dependent "
                "gate, chunkwise with the UT transform.",
        family="linear",
        citation="Yang, Kautz & Hatamizadeh 2025, Gated Delta Networks: Improving Mamba2 with Delta Rule (ICLR)",
        departures=(
            zoo.Departure("omission", "the attention core and its per-head output norm only: no short convolutions "
                                      "(the SiLU they end with is kept) and no output gate"),
            zoo.Departure("substitution", "the per-head norm is RMSNorm without affine (the paper's code has a "
                                          "learned weight, gated by the output gate)"),
            zoo.Departure("convention", "keys and values as wide as d_model / heads (the paper's code widens the "
                                        "values 2x); beta and the decay read the key input (the token written at t); "
                                        "projections Xavier-uniform without biases"),
        ),
        factory=GatedDeltaNet,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, causal_only=True, accepts_attn_mask=False, allows_different_lengths=False,
                      key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"chunk": 64},
        check_options={"chunk": 4},
        baselines={"recurrent": recurrent, "substitution-chunks": substitution_chunks},
        best_known="substitution-chunks",
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
