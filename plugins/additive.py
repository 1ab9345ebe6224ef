"""Additive (Bahdanau / concat) attention: score(q, k) = v^T tanh(W_q q + W_k k), per head.

The naive form materialises a (batch, heads, q_len, k_len, d) tensor. Here the scores are computed
over chunks of ``chunk_rows`` queries (by default q_len / d, so each chunk's temporary is no larger
than the score matrix), and the backward pass recomputes each chunk instead of keeping it, so peak
memory grows like the score matrix, not d times it. Decoding caches the projected keys features first, as
the chunks lay them out, so a step's tanh and its sum with v run over contiguous rows.
"""

import functools
import math

import torch
from torch import nn

import zoo
from zoo.decoding import append
from zoo.functional import combine_masks, merge_heads, split_heads
from zoo.reference import reference_mask, weighted_sum


def tanh_chunks(qp, kp, chunk):
    """Yield (start, rows, tanh(qp[start:start + rows] + kp)) for chunks of query rows, features first as
    (b, h, d, rows, keys) in one reused buffer. Features first, the sums over d (with v) and over rows * keys
    (in backward) are products over contiguous rows; the (rows * keys, d) @ (d, 1) form ran at a few GFLOP/s."""
    batch, heads, q_len, width = qp.shape
    # detached: the autograd.Function gives the gradients, and add(out=) refuses inputs that require grad
    # where graph capture (torch.export) traces this forward with grad mode on
    q_t = qp.detach().transpose(2, 3).contiguous().unsqueeze(-1)
    k_t = kp.detach().transpose(2, 3).contiguous().unsqueeze(-2)
    hidden = qp.new_empty(batch, heads, width, min(chunk, q_len), kp.shape[2])
    for start in range(0, q_len, chunk):
        rows = min(chunk, q_len - start)
        yield start, rows, torch.add(q_t[:, :, :, start:start + rows], k_t, out=hidden[:, :, :, :rows]).tanh_()


class ChunkedAdditiveScores(torch.autograd.Function):
    """scores[b, h, i, j] = v[h] . tanh(qp[b, h, i] + kp[b, h, j]), chunked over i, recomputed in backward."""

    @staticmethod
    def forward(ctx, qp, kp, v, chunk):
        ctx.save_for_backward(qp, kp, v)
        ctx.chunk = chunk
        batch, heads, q_len, width = qp.shape
        scores = qp.new_empty(batch, heads, q_len, kp.shape[2])
        v_row = v.view(1, heads, 1, width)
        for start, rows, hidden in tanh_chunks(qp, kp, chunk):
            scores[:, :, start:start + rows] = (v_row @ hidden.flatten(3)).view(batch, heads, rows, kp.shape[2])
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        qp, kp, v = ctx.saved_tensors
        batch, heads, _, width = qp.shape
        grad_q, grad_v = torch.empty_like(qp), torch.zeros_like(v)
        grad_k_t = kp.new_zeros(batch, heads, width, kp.shape[2])
        v_row = v.view(1, heads, 1, width)
        for start, rows, hidden in tanh_chunks(qp, kp, ctx.chunk):  # recomputed, not kept from forward
            g = grad_scores[:, :, start:start + rows]  # (b, h, rows, k)
            # d score / d v = hidden: one (d, rows * keys) @ (rows * keys, 1) product per head
            grad_v += (hidden.flatten(3) @ g.reshape(batch, heads, rows * g.shape[-1], 1)).sum(dim=0).squeeze(-1)
            # d score / d hidden = v (1 - hidden^2): g - g hidden^2 in place, in two passes; v is constant
            # over queries and keys, so it is applied after summing
            g = g.unsqueeze(2)
            local = torch.addcmul(g, hidden.square_(), g, value=-1, out=hidden)
            grad_q[:, :, start:start + rows] = local.sum(dim=4).transpose(2, 3) * v_row
            grad_k_t += local.sum(dim=3)
        return grad_q, grad_k_t.transpose(2, 3) * v_row, grad_v, None


def attend(scores, values, mask):
    """Masked softmax over the keys, applied to the values; rows with no allowed key give zeros."""
    if mask is None:
        return torch.softmax(scores, dim=-1) @ values
    row_ok = mask.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~(mask | ~row_ok), float("-inf")), dim=-1)
    return weights.masked_fill(~row_ok, 0.0) @ values


class AdditiveAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, chunk_rows: int | None = None):
        super().__init__()
        if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1):
            raise ValueError(f"chunk_rows must be a positive integer or None (auto), got {chunk_rows!r}")
        self.d_model, self.num_heads, self.chunk_rows = d_model, num_heads, chunk_rows
        head = d_model // num_heads
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model)
        self.v = nn.Parameter(torch.empty(num_heads, head).uniform_(-1 / math.sqrt(head), 1 / math.sqrt(head)))

    def rows_per_chunk(self, q_len: int) -> int:
        """``chunk_rows``, or q_len / d (per head): each chunk's (rows, keys, d) buffer is then no larger
        than the score matrix."""
        return self.chunk_rows or max(1, q_len // (self.d_model // self.num_heads))

    def projections(self, query, key, value):
        h = self.num_heads
        return split_heads(self.w_q(query), h), split_heads(self.w_k(key), h), split_heads(value, h)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        qp, kp, values = self.projections(query, key, value)
        chunk = self.rows_per_chunk(qp.shape[2])
        scores = ChunkedAdditiveScores.apply(qp, kp, self.v, chunk)
        mask = combine_masks(attn_mask, is_causal, query.shape[1], key.shape[1], query.device)
        return merge_heads(attend(scores, values, mask))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    h = module.num_heads
    qp = query.double() @ module.w_q.weight.detach().double().T
    kp = key.double() @ module.w_k.weight.detach().double().T + module.w_k.bias.detach().double()
    qp, kp, values = (x.unflatten(-1, (h, -1)).transpose(1, 2) for x in (qp, kp, value.double()))
    hidden = torch.tanh(qp.unsqueeze(3) + kp.unsqueeze(2))  # (b, h, q_len, k_len, d)
    scores = torch.einsum("bhijd,hd->bhij", hidden, module.v.detach().double())
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    return weighted_sum(scores, values, mask).transpose(1, 2).flatten(2)


def prefill(module, query, key, value, key_mask=None):
    """The prompt through the causal forward's scores; its projected keys (features first) and values cached."""
    qp, kp, values = module.projections(query, key, value)
    scores = ChunkedAdditiveScores.apply(qp, kp, module.v, module.rows_per_chunk(qp.shape[2]))
    mask = combine_masks(None if key_mask is None else key_mask[:, None, None, :], True, qp.shape[2], kp.shape[2],
                         query.device)
    state = {"k": append(None, kp.transpose(2, 3), 3), "v": append(None, values, 2)}
    if key_mask is not None:
        state["key_mask"] = append(None, key_mask.to(torch.bool), 1)
    return merge_heads(attend(scores, values, mask)), state


def step(module, state, query, key, value, key_mask=None):
    """The next query scored against every cached key: v . tanh(W_q q + W_k k) as one (d, keys) tanh per head."""
    qp, kp, values = module.projections(query, key, value)
    state = dict(state)
    before = state["v"].shape[2]
    state["k"], state["v"] = append(state["k"], kp.transpose(2, 3), 3), append(state["v"], values, 2)
    mask = None
    if key_mask is not None or "key_mask" in state:
        ones = functools.partial(torch.ones, qp.shape[0], dtype=torch.bool, device=qp.device)
        new = ones(1) if key_mask is None else key_mask.to(torch.bool)
        state["key_mask"] = append(state.get("key_mask", ones(before)), new, 1)
        mask = state["key_mask"][:, None, None, :]
    hidden = (qp.transpose(2, 3) + state["k"]).tanh_()  # (batch, heads, d, keys)
    scores = module.v.view(1, module.num_heads, 1, -1) @ hidden
    return merge_heads(attend(scores, state["v"], mask)), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize  # every projected key and value


def naive_broadcast(module):
    """A baseline: the textbook form that materialises the (batch, heads, q, k, d) tanh tensor."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        qp, kp, values = module.projections(query, key, value)
        hidden = torch.tanh(qp.unsqueeze(3) + kp.unsqueeze(2))
        scores = (hidden @ module.v.view(1, module.num_heads, 1, -1, 1)).squeeze(-1)
        mask = combine_masks(attn_mask, is_causal, query.shape[1], key.shape[1], query.device)
        return merge_heads(attend(scores, values, mask))

    return run


def tanh_floor(module):
    """A floor: the bare tanh over every (query, key, feature) triple, chunked as the variant chunks it
    (from a fixed random buffer into a second one), with nothing else: the op additive attention cannot
    avoid, so the variant's time over this one is what its own overhead costs."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        batch, n, heads = query.shape[0], query.shape[1], module.num_heads
        width = module.d_model // heads
        chunk = module.rows_per_chunk(n)
        source = torch.randn(batch, heads, chunk, key.shape[1], width, dtype=query.dtype, device=query.device)
        target = torch.empty_like(source)
        for start in range(0, n, chunk):
            rows = min(chunk, n - start)
            torch.tanh(source[:, :, :rows], out=target[:, :, :rows])
        return target

    return run


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="additive",
        summary="Additive (Bahdanau/concat) attention with chunked, recomputed tanh scores.",
        family="additive",
        citation="Bahdanau, Cho and Bengio 2015, Neural Machine Translation by Jointly Learning to Align and Translate",
        departures=(
            zoo.Departure("extension",
                          "a multi-head form: each head scores with its own slice of W_q q + W_k k and its own v (num_heads=1 is the paper's)"),
            zoo.Departure("extension", "a learnt bias inside the tanh (W_k's); the paper's alignment model has none"),
            zoo.Departure("omission",
                          "keys must be d_model wide: the paper's U_a maps 2n-wide bidirectional-RNN annotations to n"),
            zoo.Departure("extension",
                          "general query/key/value attention with masks and is_causal; the paper scores decoder states against annotations"),
        ),
        factory=AdditiveAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=2),
        options={"chunk_rows": None},
        check_options={"chunk_rows": 2},
        baselines={"naive-broadcast": naive_broadcast},
        best_known="naive-broadcast",
        floors={"tanh-floor": tanh_floor},
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="token", state_bytes=cache_bytes),
        targets=(
            zoo.Target("time-ratio", versus="tanh-floor", at_most=1.5, phase="fwd", n=1024,
                       note="forward within 1.5x of a bare tanh over its n * n * d_model elements at n=1024"),
            zoo.Target("memory-ratio", versus="naive-broadcast", at_most=1 / 8, phase="fwd", n=2048,
                       note="forward peak memory at most 1/8 of the naive broadcast form's at n=2048"),
            zoo.Target("memory-ratio", versus="naive-broadcast", at_most=1 / 4, phase="fwd+bwd", n=2048,
                       note="forward+backward peak memory at most 1/4 of the naive form's at n=2048"),
        ),
    ))
