"""Mamba-2's state-space layer (SSD, Dao & Gu 2024): a linear recurrence whose scalar per-head decay comes from
an input-dependent step,

    a_t = exp(dt_t A),  S_t = a_t S_(t-1) + dt_t x_t B_t^T,  y_t = S_t C_t + D x_t,

with ``dt_t = softplus(w . x_t + b)`` per head, ``A = -exp(A_log)``, a (head size x d_state) state per head, and B,
C shared by the heads (one group). In attention terms C is the query, B the key and dt x the value, under the
causal decay ``L_ts = exp(dt_(s+1) A + ... + dt_t A)``: linear attention with a data-dependent forgetting.

The fast path is the chunked SSD algorithm: inside chunks of ``chunk`` tokens the quadratic (C B^T * L) (dt x),
across them each chunk's state decayed to its end and carried forward by a loop over chunks (elementwise, so the
cost stays linear in n), read by the next chunk's queries. Decoding is the recurrence, the state kept in float32 at
least, as the paper's kernels keep it.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import refuse_key_mask
from zoo.functional import merge_heads, split_heads
from zoo.reference import linear, segment_sums


class Mamba2(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, d_state: int = 64, chunk: int = 64):
        super().__init__()
        for label, value in (("d_state", d_state), ("chunk", chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        self.d_model, self.num_heads, self.d_state, self.chunk = d_model, num_heads, d_state, chunk
        self.c_proj, self.b_proj = (nn.Linear(d_model, d_state, bias=False) for _ in range(2))
        self.x_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=False) for _ in range(2))
        for layer in (self.c_proj, self.b_proj, self.x_proj, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)
        self.dt_proj = nn.Linear(d_model, num_heads)
        # as the paper's code: dt = softplus(bias) log-uniform in [0.001, 0.1] at the start, A = -U(1, 16)
        dt = torch.exp(torch.empty(num_heads).uniform_(math.log(1e-3), math.log(1e-1)))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(1, 16).log())
        self.D = nn.Parameter(torch.ones(num_heads))

    def project(self, query, key, value):
        """C (batch, n, d_state) from the query input; B and the step dt from the key input (what token t writes);
        x (batch, heads, n, head size) from the value input; and log a_t = dt_t A (batch, heads, n)."""
        dt = F.softplus(self.dt_proj(key)).transpose(1, 2)
        return (self.c_proj(query), self.b_proj(key), split_heads(self.x_proj(value), self.num_heads), dt,
                dt * -torch.exp(self.A_log).view(-1, 1))

    def forward(self, query, key, value, attn_mask=None, is_causal=True):
        c, b, x, dt, log_a = self.project(query, key, value)
        y = ssd(x * dt.unsqueeze(-1), log_a, b, c, self.chunk, carry_forward)
        return self.out_proj(merge_heads(y + self.D.view(-1, 1, 1) * x))


def segsum(log_a):
    """(..., T) -> (..., T, T): ``out[i, j] = log_a[j + 1] + ... + log_a[i]`` for j <= i (the log of the decay from
    position j to i), -inf above the diagonal; sums of the terms themselves, not differences of cumulative sums."""
    size = log_a.shape[-1]
    below = torch.ones(size, size, dtype=torch.bool, device=log_a.device).tril(-1)
    sums = log_a.unsqueeze(-1).expand(*log_a.shape, size).masked_fill(~below, 0.0).cumsum(dim=-2)
    return sums.masked_fill(~below.logical_or(torch.eye(size, dtype=torch.bool, device=log_a.device)), float("-inf"))


def ssd(x, log_a, b, c, chunk, across):
    """The chunked SSD algorithm on (batch, heads, n, P) inputs already scaled by dt, log decays (batch, heads, n),
    B and C (batch, n, N): ``across(states, chunk_log_decay)`` gives the state entering each chunk."""
    batch, heads, n, width = x.shape
    if n == 0:
        return x * 0.0  # no chunks, and an output still in the graph
    chunks = -(-n // chunk)
    pad = chunks * chunk - n  # padded positions write nothing (x = 0) and do not decay (log a = 0)
    x = F.pad(x, (0, 0, 0, pad)).unflatten(2, (chunks, chunk))  # (b, h, c, l, P)
    log_a = F.pad(log_a, (0, pad)).unflatten(2, (chunks, chunk))  # (b, h, c, l)
    b, c = (F.pad(t, (0, 0, 0, pad)).unflatten(1, (chunks, chunk)).unsqueeze(1) for t in (b, c))  # (b, 1, c, l, N)
    within = log_a.cumsum(dim=-1)
    local = ((c @ b.transpose(-1, -2)) * torch.exp(segsum(log_a))) @ x
    states = (x * torch.exp(within[..., -1:] - within).unsqueeze(-1)).transpose(-1, -2) @ b  # (b, h, c, P, N)
    entering = across(states, within[..., -1])
    earlier = (c @ entering.transpose(-1, -2)) * torch.exp(within).unsqueeze(-1)
    return (local + earlier).flatten(2, 3)[:, :, :n]


def carry_forward(states, chunk_log_decay):
    """The state entering each chunk, by a loop over chunks: S_in(c + 1) = a(c) S_in(c) + state(c) (views taken at
    once, appended to a list: indexing inside the loop made autograd's backward build a full-size zero per chunk)."""
    carry = torch.exp(chunk_log_decay).unsqueeze(-1).unsqueeze(-1)  # (b, h, c, 1, 1)
    state, entering = torch.zeros_like(states[:, :, 0]), []
    for chunk_state, decay in zip(states.unbind(2), carry.unbind(2)):
        entering.append(state)
        state = decay * state + chunk_state
    return torch.stack(entering, dim=2)


def decay_matrix(states, chunk_log_decay):
    """The state entering each chunk in one product, as the paper's minimal SSD listing: a (chunks + 1) x
    (chunks + 1) matrix of chunk-to-chunk decays times every chunk's state (cost quadratic in the chunks)."""
    decays = torch.exp(segsum(F.pad(chunk_log_decay, (1, 0))))  # (b, h, c + 1, c + 1)
    padded = F.pad(states, (0, 0, 0, 0, 1, 0))  # a zero state before the first chunk
    return (decays @ padded.flatten(3)).view_as(padded)[:, :, :-1]


def reference(module, query, key, value, attn_mask=None, is_causal=True):
    """SSD's quadratic form in float64: y_t = sum_{s <= t} (C_t . B_s) L_ts dt_s x_s + D x_t with the decay
    L_ts = exp(sum of dt_l A over l = s+1..t), each sum over an explicit indicator of the positions between."""
    n = query.shape[1]
    c, b = linear(query, module.c_proj), linear(key, module.b_proj)
    x = linear(value, module.x_proj).unflatten(-1, (module.num_heads, -1)).transpose(1, 2)
    dt = F.softplus(linear(key, module.dt_proj)).transpose(1, 2)  # (b, h, n)
    log_a = dt * -torch.exp(module.A_log.detach().double()).view(-1, 1)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    decay = torch.exp(segment_sums(log_a)) * causal.double()
    y = ((c @ b.transpose(-1, -2)).unsqueeze(1) * decay) @ (dt.unsqueeze(-1) * x)
    y = y + module.D.detach().double().view(-1, 1, 1) * x
    return linear(y.transpose(1, 2).flatten(2), module.out_proj)



def prefill(module, query, key, value, key_mask=None):
    """The chunked forward over the prompt, and its state S_p = sum_s exp(log a_(s+1) + ... + log a_p) dt_s x_s B_s^T."""
    refuse_key_mask("mamba2", key_mask)
    dtype = torch.promote_types(query.dtype, torch.float32)
    c, b, x, dt, log_a = module.project(*(t.to(dtype) for t in (query, key, value)))
    if query.shape[1]:
        out = module.out_proj(merge_heads(ssd(x * dt.unsqueeze(-1), log_a, b, c, module.chunk, carry_forward)
                                          + module.D.to(dtype).view(-1, 1, 1) * x)).to(query.dtype)
    else:
        out = query.new_zeros(query.shape)
    within = log_a.cumsum(-1)
    weights = torch.exp(within[..., -1:] - within) * dt if query.shape[1] else dt
    state = (x * weights.unsqueeze(-1)).transpose(-1, -2) @ b.unsqueeze(1)  # (b, h, P, N)
    return out, {"state": state}


def step(module, state, query, key, value, key_mask=None):
    """The next token: S_t = a_t S_(t-1) + dt_t x_t B_t^T in place, y_t = S_t C_t + D x_t."""
    refuse_key_mask("mamba2", key_mask)
    s = state["state"]
    c, b, x, dt, log_a = module.project(*(t.to(s.dtype) for t in (query, key, value)))
    s.mul_(torch.exp(log_a).unsqueeze(-1)).add_((x * dt.unsqueeze(-1)).transpose(-1, -2) @ b.unsqueeze(1))
    y = (c.unsqueeze(1) @ s.transpose(-1, -2)) + module.D.to(s.dtype).view(-1, 1, 1) * x
    return module.out_proj(merge_heads(y).to(query.dtype)), state


def state_bytes(batch, context, d_model, num_heads, itemsize, d_state=64, **options):
    return batch * d_model * d_state * max(itemsize, 4)  # a (head size x d_state) state per head, float32 at least


def recurrent(module):
    """A baseline: the recurrence token by token, as the model decodes (a Python loop over positions)."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        c, b, x, dt, log_a = module.project(query, key, value)
        state = x.new_zeros(*x.shape[:2], x.shape[-1], b.shape[-1])
        outputs = []
        for t in range(x.shape[2]):
            write = (x[:, :, t] * dt[:, :, t, None]).unsqueeze(-1) * b[:, None, t].unsqueeze(-2)
            state = torch.exp(log_a[:, :, t, None, None]) * state + write
            outputs.append(state @ c[:, None, t].unsqueeze(-1))
        y = torch.cat(outputs, dim=-1).transpose(-1, -2) if outputs else x * 0.0
        return module.out_proj(merge_heads(y + module.D.view(-1, 1, 1) * x))

    return run


def minimal_ssd(module):
    """A baseline: the chunked algorithm with every chunk's entering state from one decay-matrix product, as the
    paper's minimal SSD listing computes it."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        c, b, x, dt, log_a = module.project(query, key, value)
        return module.out_proj(merge_heads(ssd(x * dt.unsqueeze(-1), log_a, b, c, module.chunk, decay_matrix)
                                           + module.D.view(-1, 1, 1) * x))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, d_state=64, chunk=64, **options):
    """The projections, and the chunked form's matmuls on the sequence padded to whole chunks: C B^T and its
    product with x inside chunks, the chunk states and their reads (the carry across chunks is elementwise)."""
    padded = -(-q_len // chunk) * chunk
    projections = 2.0 * batch * q_len * d_model * (2 * d_state + 2 * d_model + num_heads)
    return projections + 2.0 * batch * padded * (chunk * d_state + chunk * d_model + 2 * d_model * d_state)


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="mamba2",
        summary="Mamba-2's SSD layer: a linear recurrence with an input-dependent scalar decay per head, chunked.",
        family="linear",
        citation="Dao & Gu 2024, Transformers are SSMs: Generalized Models and Efficient Algorithms Through "
                 "Structured State Space Duality (ICML)",
        departures=(
            zoo.Departure("omission", "the SSM layer of the Mamba-2 block only: no causal depthwise convolution of x, "
                                      "B and C, no SiLU, no output gate z and no grouped RMSNorm"),
            zoo.Departure("convention", "C, B with dt, and x from separate projections of the query, key and value "
                                        "inputs (the block takes all from one in_proj of the token); one group (B "
                                        "and C shared by the heads); projections Xavier-uniform without biases; A "
                                        "and dt's bias initialised as the paper's code"),
        ),
        factory=Mamba2,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, causal_only=True, accepts_attn_mask=False, allows_different_lengths=False,
                      key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"d_state": 64, "chunk": 64},
        check_options={"d_state": 4, "chunk": 4},
        baselines={"recurrent": recurrent, "minimal-ssd": minimal_ssd},
        best_known="minimal-ssd",
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
