"""Based (Arora et al. 2024): linear attention with a second-order Taylor feature map, beside a small exact
sliding window of softmax attention,

    y_i = sum_(j <= i) w_ij v_j / sum_(j <= i) w_ij,   w_ij = 1 + s_ij + s_ij^2 / 2,   s_ij = q_i . k_j / sqrt(f),

on queries and keys projected to ``feature_dim`` = f features per head (16 in the paper): the weight is
exp(s)'s Taylor expansion to second order, positive for every s, and equals phi(q_i) . phi(k_j) for the feature
map phi(x) = [1, x / f^(1/4), (x outer x) / sqrt(2 f)], so the linear form keeps a state of
(1 + f + f (f + 1) / 2) x (d + 1) numbers per head whatever the context (each unordered pair of features once). The window branch is softmax attention over the
``window`` keys before each query and its own (0 <= i - j <= window), with queries and keys of its own and the
same values; the layer outputs the sum of the two branches. The feature size and the window are the dials of
the state a sequence keeps (the recall-versus-state trade-off the paper is about).

Fast path: the linear branch on chunks (``zoo.functional.kernel_attention``: prefix states between chunks, the
Taylor weights inside them) or, on a sequence short enough that it takes fewer FLOPs (n up to about 420 with the
defaults: the chunks' states are (1 + f + f (f + 1) / 2) features wide), in its quadratic form from the f-wide
queries and keys; the window branch on query blocks of ``window`` that each attend their own and the
previous block's keys under one band mask in fused SDPA; O(n) time and memory. Decoding keeps the linear
branch's state (float32 at least) and the last ``window`` window keys and values.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import push_window, refuse_key_mask, window_cache
from zoo.functional import kernel_attention, merge_heads, sliding_window_attention, split_heads
from zoo.reference import linear, reference_mask, softmax_attention


class Based(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, feature_dim: int = 16, window: int = 64, chunk: int = 64,
                 form: str = "cheaper"):
        super().__init__()
        for label, value in (("feature_dim", feature_dim), ("window", window), ("chunk", chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(map(repr, FORMS))}, got {form!r}")
        self.d_model, self.num_heads = d_model, num_heads
        self.feature_dim, self.window, self.chunk, self.form = feature_dim, window, chunk, form
        self.q_features, self.k_features = (nn.Linear(d_model, num_heads * feature_dim, bias=False)
                                            for _ in range(2))
        self.q_window, self.k_window, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=False)
                                                                    for _ in range(4))
        for layer in (self.q_features, self.k_features, self.q_window, self.k_window, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)

    def project(self, query, key, value):
        """Per head (batch, heads, n, .): the f features of the queries and keys (before the Taylor map), the
        window branch's queries and keys, and the values."""
        h = self.num_heads
        return (split_heads(self.q_features(query), h), split_heads(self.k_features(key), h),
                split_heads(self.q_window(query), h), split_heads(self.k_window(key), h),
                split_heads(self.v_proj(value), h))

    def forward(self, query, key, value, attn_mask=None, is_causal=True):
        return self.attend(*self.project(query, key, value))

    def attend(self, fq, fk, q, k, v):
        """The causal output from the projections: both branches, summed, the heads merged and projected."""
        n = q.shape[2]
        if self.form == "quadratic" or self.form == "cheaper" and quadratic_is_cheaper(
                n, v.shape[-1], self.feature_dim, self.chunk):
            linear_branch = quadratic_taylor(fq, fk, v, self.feature_dim)
        else:
            linear_branch = kernel_attention(taylor(fq), taylor(fk), v, is_causal=True, chunk=self.chunk)
        return self.out_proj(merge_heads(linear_branch + sliding_window_attention(q, k, v, self.window)))


FORMS = ("cheaper", "chunked", "quadratic")  # the linear branch's form: whichever takes fewer FLOPs, or one of them


def chunked_flops(n: int, head: int, feature_dim: int, chunk: int) -> float:
    """Multiply-adds per head of the linear branch on chunks: states, their reads and the Taylor weights inside
    chunks times the values (widened by a ones column for the normaliser), on the sequence padded to whole chunks."""
    features = 1 + feature_dim + feature_dim * (feature_dim + 1) // 2
    return -(-n // chunk) * chunk * (2 * features * (head + 1) + chunk * features + chunk * (head + 1))


def quadratic_is_cheaper(n: int, head: int, feature_dim: int, chunk: int) -> bool:
    """Whether the quadratic form's n^2 (f + d) multiply-adds per head are at most the chunked form's."""
    return n * n * (feature_dim + head) <= chunked_flops(n, head, feature_dim, chunk)


def quadratic_taylor(fq, fk, v, feature_dim):
    """The linear branch in its parallel form: weights 1 + s + s^2 / 2 on the causal (n, n) scores s = q . k /
    sqrt(f) of the f-wide features, normalised per query (the weights are positive)."""
    s = fq @ fk.transpose(-1, -2) / math.sqrt(feature_dim)
    weights = (1 + s + s * s / 2).tril()
    return (weights @ v) / weights.sum(-1, keepdim=True)


def taylor(x):
    """phi(x) = [1, x / f^(1/4), x_a x_b / sqrt(f) for a < b, x_a^2 / sqrt(2 f)] on the last dimension (f
    features): phi(q) . phi(k) = 1 + q.k / sqrt(f) + (q.k)^2 / (2 f), the Taylor expansion of exp(q.k / sqrt(f))
    to second order. Each unordered pair (a, b) is kept once: 1 + f + f (f + 1) / 2 features, where the paper's
    vec(x x^T) / sqrt(2 f) keeps both orders (1 + f + f^2, the same kernel in a state 1.8x larger at f = 16)."""
    f = x.shape[-1]
    first, second = torch.triu_indices(f, f, device=x.device)
    scale = x.new_full(first.shape, 1 / math.sqrt(f)).masked_fill(first == second, 1 / math.sqrt(2 * f))
    return torch.cat([torch.ones_like(x[..., :1]), x / f ** 0.25, x[..., first] * x[..., second] * scale], dim=-1)


def reference(module, query, key, value, attn_mask=None, is_causal=True):
    """Both branches in float64 as the paper writes them: the linear branch's weights 1 + s + s^2 / 2 on each
    (query, key) pair from s = q . k / sqrt(f) (not from a feature map), normalised over j <= i; the window
    branch a plain softmax over the band 0 <= i - j <= window."""
    h, n = module.num_heads, query.shape[1]

    def heads(x):
        return x.unflatten(-1, (h, -1)).transpose(1, 2)

    fq, fk = heads(linear(query, module.q_features)), heads(linear(key, module.k_features))
    q, k, v = (heads(linear(x, layer)) for x, layer in ((query, module.q_window), (key, module.k_window),
                                                         (value, module.v_proj)))
    i = torch.arange(n).view(n, 1)
    j = torch.arange(n).view(1, n)
    s = fq @ fk.transpose(-1, -2) / math.sqrt(module.feature_dim)
    weights = (1 + s + s * s / 2) * (j <= i)
    linear_branch = (weights @ v) / weights.sum(-1, keepdim=True)
    band = (i - j >= 0) & (i - j <= module.window)
    window_branch = softmax_attention(q, k, v, reference_mask(band, False, n, n))
    return linear(merge_heads(linear_branch + window_branch), module.out_proj)


def prefill(module, query, key, value, key_mask=None):
    """The forward over the prompt; the linear branch's sums phi(k)^T v and phi(k) (float32 at least) and the last
    ``window`` window keys and values."""
    refuse_key_mask("based", key_mask)
    dtype = torch.promote_types(query.dtype, torch.float32)
    fq, fk, q, k, v = module.project(query, key, value)
    output = module.attend(fq, fk, q, k, v)
    fk, wide = taylor(fk).to(dtype), v.to(dtype)
    state = {"kv": fk.transpose(-1, -2) @ wide, "z": fk.sum(2), "k": window_cache(k, module.window, 2),
             "v": window_cache(v, module.window, 2), "position": query.shape[1]}
    return output, state


def step(module, state, query, key, value, key_mask=None):
    """The next token: the linear state gains phi(k)^T v and phi(k); the query attends the cached window and its
    own key; the key then enters the window's cache (in place of the oldest, once the cache is full)."""
    refuse_key_mask("based", key_mask)
    fq, fk, q, k, v = module.project(query, key, value)
    fq, fk = taylor(fq), taylor(fk)
    kv, z = state["kv"], state["z"]
    kv.add_(fk.transpose(-1, -2).to(kv.dtype) @ v.to(kv.dtype))
    z.add_(fk.squeeze(2).to(z.dtype))
    fq = fq.to(kv.dtype)
    linear_branch = ((fq @ kv) / (fq @ z.unsqueeze(-1))).to(query.dtype)
    window_branch = F.scaled_dot_product_attention(q, torch.cat([state["k"], k], 2), torch.cat([state["v"], v], 2))
    state = dict(state)
    state["k"], state["v"] = (push_window(state[name], x, state["position"], module.window, 2)
                              for name, x in (("k", k), ("v", v)))
    state["position"] += 1
    return module.out_proj(merge_heads(linear_branch + window_branch)), state


def state_bytes(batch, context, d_model, num_heads, itemsize, feature_dim=16, window=64, **options):
    features = 1 + feature_dim + feature_dim * (feature_dim + 1) // 2
    linear_state = batch * num_heads * features * (d_model // num_heads + 1) * max(itemsize, 4)
    return linear_state + 2 * batch * min(context, window) * d_model * itemsize


def _dense_window(module, q, k, v):
    n = q.shape[2]
    i = torch.arange(n, device=q.device).view(n, 1)
    j = torch.arange(n, device=q.device).view(1, n)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(i - j >= 0) & (i - j <= module.window))


def quadratic(module):
    """A baseline: the parallel form (as the paper's training kernel): the Taylor weights 1 + s + s^2/2 on the
    (n, n) causal scores from the f-wide queries and keys, the window branch in SDPA with a dense band mask."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        fq, fk, q, k, v = module.project(query, key, value)
        linear_branch = quadratic_taylor(fq, fk, v, module.feature_dim)
        return module.out_proj(merge_heads(linear_branch + _dense_window(module, q, k, v)))

    return run


def recurrent(module):
    """A baseline: the linear branch token by token (its state updated per position, a Python loop), the window
    branch in SDPA with a dense band mask."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        fq, fk, q, k, v = module.project(query, key, value)
        fq, fk = taylor(fq), taylor(fk)
        kv = fk.new_zeros(*fk.shape[:2], fk.shape[-1], v.shape[-1])
        z = fk.new_zeros(*fk.shape[:2], fk.shape[-1], 1)
        outputs = []
        for t in range(fq.shape[2]):
            kv = kv + fk[:, :, t, :, None] * v[:, :, t, None]
            z = z + fk[:, :, t, :, None]
            outputs.append((fq[:, :, t, None] @ kv) / (fq[:, :, t, None] @ z))
        linear_branch = torch.cat(outputs, dim=2) if outputs else v * 0.0
        return module.out_proj(merge_heads(linear_branch + _dense_window(module, q, k, v)))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, feature_dim=16, window=64, chunk=64, form="cheaper", **options):
    """The projections (two to f features per head, four d_model-wide); the linear branch's matmuls in the form
    the forward takes (:func:`chunked_flops`, or the quadratic form's scores and weighted values); the window
    branch's SDPA, each block of ``window`` queries against 2 ``window`` keys. The Taylor features themselves are
    elementwise."""
    head = d_model // num_heads
    blocks = -(-q_len // window) * window
    projections = 2.0 * batch * q_len * (2 * d_model * num_heads * feature_dim + 4 * d_model * d_model)
    quadratic = form == "quadratic" or form == "cheaper" and quadratic_is_cheaper(q_len, head, feature_dim, chunk)
    per_head = q_len * q_len * (feature_dim + head) if quadratic else chunked_flops(q_len, head, feature_dim, chunk)
    linear_branch = 2.0 * batch * num_heads * per_head
    window_branch = 4.0 * batch * num_heads * blocks * 2 * window * head
    return projections + linear_branch + window_branch


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="based",
        summary="Based: linear attention with a second-order Taylor feature map plus a small exact sliding window; "
                "the feature size and the window dial the state.",
        family="linear",
        citation="Arora, Eyuboglu, Zhang, Timalsina, Alberti, Zinsley, Zou, Rudra & Re 2024, Simple linear "
                 "attention language models balance the recall-throughput tradeoff (ICML)",
        departures=(
            zoo.Departure("substitution", "one layer sums the two branches' outputs (the paper's models interleave "
                                          "linear-attention layers, sliding-window layers and gated convolutions)"),
            zoo.Departure("omission", "no short convolutions or gated-convolution layers"),
            zoo.Departure("convention", "the Taylor features keep each unordered pair of features once (1 + f + "
                                        "f (f + 1) / 2 features where the paper's code keeps 1 + f + f^2): the same "
                                        "kernel, a state 0.56x as large at f = 16"),
            zoo.Departure("convention", "the window reaches window keys back plus the query's own (window + 1 keys, "
                                        "as the zoo's windowed attention); the window branch has queries and keys of "
                                        "its own and shares the values; projections Xavier-uniform without biases"),
        ),
        factory=Based,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, causal_only=True, accepts_attn_mask=False, allows_different_lengths=False,
                      key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"feature_dim": 16, "window": 64, "chunk": 64, "form": "cheaper"},
        # the small shapes check the chunked form; the quadratic one is checked at the defaults (long sequences)
        check_options={"feature_dim": 3, "window": 3, "chunk": 4, "form": "chunked"},
        quality_options={"window": 8},
        # the feature dial reaches down from the default 16: at 32 (561 features) one training of the hardest recall
        # task cost twice the default's, and the dials put based's quality job past the quick profile's 900 s limit
        state_dials={"window": (2, 32), "feature_dim": (4, 8)},
        baselines={"recurrent": recurrent, "quadratic": quadratic},
        best_known="quadratic",
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="window", state_bytes=state_bytes),
        targets=(
            zoo.Target("time-ratio", versus="recurrent", at_most=1 / 10, mode="causal", phase="fwd+bwd", n=4096,
                       note="at least 10x faster than its linear branch token by token (judged on the long board: the "
                            "quick profile leaves the recurrence out)"),
            zoo.Target("decode-growth", at_least=1 / 1.1, at_most=1.1, mode="causal", phase="decode",
                       note="time per generated token constant within 10% from the shortest timed context to the "
                            "longest (every timed context is past the window)"),
        ),
    ))
