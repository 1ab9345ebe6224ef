"""Performer attention: FAVOR+ positive orthogonal random features (Choromanski et al. 2021).

softmax(q.k / sqrt(d)) is approximated by phi(q).phi(k) with phi(x) = exp(W x - |x|^2 / 2) / sqrt(m) on
x scaled by d^-1/4, where the m rows of W are blocks of orthogonal directions with Gaussian norms, drawn
once per head when the module is built (a buffer: saved with it, never trained), their directions uniformly
random (``haar_orthogonal``). The attention is then kernel attention of exponential features
(``zoo.functional.exp_kernel_attention``): O(n m d), causal by a state carried over chunks.

Numerics: each query's features are shifted by their own maximum, and each query weighs the keys by a shift
taken only over the keys it may attend (``zoo.functional.exp_kernel_attention``), so a masked or future key with
large logits cannot zero the others' features in float32; the shifts cancel in the ratio and are constants to
autograd. Half-precision inputs compute the features in float32. The decoder's state (sum phi(k)^T v and
sum phi(k) per head) keeps the largest allowed key logit seen so far as its shift and is rescaled whenever a new
key raises it.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import continue_exp_kernel, exp_kernel_attention, merge_heads, split_heads
from zoo.reference import reference_mask, weighted_sum


def haar_orthogonal(width: int) -> torch.Tensor:
    """A uniformly random (Haar) orthogonal matrix: Q of a Gaussian matrix's QR with its columns' signs fixed by
    R's diagonal. Without that fix (Q as torch.linalg.qr returns it) the rows are not isotropic and FAVOR+'s
    kernel estimate is biased (Mezzadri 2007)."""
    q, r = torch.linalg.qr(torch.randn(width, width))
    return q * torch.sgn(torch.diagonal(r)).unsqueeze(0)


def orthogonal_features(heads: int, features: int, width: int) -> torch.Tensor:
    """(heads, features, width): per head, blocks of ``width`` orthogonal rows in uniformly random directions,
    each row with the norm of a Gaussian vector (FAVOR+'s orthogonal random features)."""
    blocks = []
    for _ in range(heads):
        rows = []
        for _ in range(-(-features // width)):
            rows.append(haar_orthogonal(width).T)
        directions = torch.cat(rows)[:features]
        norms = torch.randn(features, width).norm(dim=1, keepdim=True)
        blocks.append(directions * norms)
    return torch.stack(blocks)


class PerformerAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, features: int = 256, chunk: int = 64):
        super().__init__()
        for label, value in (("features", features), ("chunk", chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        self.d_model, self.num_heads, self.features, self.chunk = d_model, num_heads, features, chunk
        self.register_buffer("projection", orthogonal_features(num_heads, features, d_model // num_heads))

    def logits(self, x):
        """log(phi(x) sqrt(m)) = W x - |x|^2 / 2 on (batch, heads, seq, d), in float32 at least."""
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        scale = x.shape[-1] ** -0.25  # the norm from x itself, not from x * scale: autograd keeps one tensor less
        return (x * scale) @ self.projection.to(x.dtype).transpose(-2, -1) - (x * x).sum(-1, keepdim=True) * (
            scale * scale / 2)

    def query_features(self, x):
        """phi(x) sqrt(m) for queries, shifted by each query's own largest logit (it cancels in the ratio)."""
        logits = self.logits(x)
        shift = logits.detach().amax(dim=-1, keepdim=True) if logits.numel() else 0.0
        return torch.exp(logits - shift)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        fq = self.query_features(q)
        out = exp_kernel_attention(fq, self.logits(k), v.to(fq.dtype), attn_mask, is_causal, self.chunk)
        return merge_heads(out.to(query.dtype))


def _log_features(module, x):
    """log(phi(x)) for FAVOR+'s phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m), x' = x d^-1/4, on (batch, heads, seq, d),
    in float64."""
    w = module.projection.double()
    x = x.double() * x.shape[-1] ** -0.25
    return torch.einsum("bhnd,hmd->bhnm", x, w) - (x * x).sum(-1, keepdim=True) / 2 - math.log(w.shape[1]) / 2


def features(module, x):
    """phi(x) in float64, without shifts: phi(q) . phi(k) is an unbiased estimate of exp(q . k / sqrt(d)) over the
    draws of W."""
    return torch.exp(_log_features(module, x))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) with the module's features, in float64: a softmax over
    the keys of log(phi(q_i).phi(k_j)), a log-sum-exp over the features, so no product of features underflows
    (at logits of -750 even float64's would)."""
    h = module.num_heads
    q, k, v = (x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value))
    mask = reference_mask(attn_mask, is_causal, q.shape[2], k.shape[2])
    log_q, log_k = _log_features(module, q), _log_features(module, k)
    log_kernel = torch.logsumexp(log_q.unsqueeze(-2) + log_k.unsqueeze(-3), dim=-1)  # (b, h, q_len, k_len)
    return weighted_sum(log_kernel, v, mask).transpose(1, 2).flatten(2)


def _allowed(logits, key_mask):
    """The keys' logits, -inf where a key is padding: it neither adds to the state nor raises its shift."""
    return logits if key_mask is None else logits.masked_fill(~key_mask[:, None, :, None], -math.inf)


PREFILL_PIECE = 1024
"""Prompt tokens a prefill takes at a time, each piece continuing from the state the earlier ones left: its memory
is one piece's features, not the whole prompt's (at batch 16 and 16384 tokens those are gigabytes)."""


def prefill(module, query, key, value, key_mask=None):
    """The causal forward over the prompt, a piece at a time (``PREFILL_PIECE``), and the state its allowed keys
    leave: sum phi(k)^T [v, 1] per head (the normaliser as a ones column beside the values), kept relative to the
    keys' largest logit (-inf for none: the first allowed key of a step then sets it)."""
    q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
    dtype = torch.promote_types(v.dtype, torch.float32)
    kv = q.new_zeros(q.shape[0], module.num_heads, module.features, v.shape[-1] + 1, dtype=dtype)
    shift = kv.new_full(kv.shape[:2], -math.inf)
    outputs = []
    for begin in range(0, max(q.shape[2], 1), PREFILL_PIECE):
        piece = slice(begin, begin + PREFILL_PIECE)
        logits = _allowed(module.logits(k[:, :, piece]), None if key_mask is None else key_mask[:, piece])
        out, kv, shift = continue_exp_kernel(module.query_features(q[:, :, piece]), logits,
                                             v[:, :, piece].to(dtype), kv, shift, module.chunk)
        outputs.append(out)
    return merge_heads(torch.cat(outputs, dim=2).to(query.dtype)), {"kv": kv, "shift": shift[..., None, None]}


def step(module, state, query, key, value, key_mask=None):
    """The next token: the shift raised to its key's largest logit where that is larger (never by a padding key)
    and the state rescaled by exp(old - new), exactly 1 where it stays (0 for an empty state, whose shift is -inf);
    numerator and normaliser scale alike, so the outputs are the forward's. Then its features times [v, 1] are
    added in place and its query reads the state, numerator and normaliser in one product. The query's and the
    key's logits come from one projection."""
    kv, shift = state["kv"], state["shift"]
    q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
    q_logits, logits = module.logits(torch.cat((q, k), dim=-2)).split((q.shape[-2], k.shape[-2]), dim=-2)
    if key_mask is None:  # the key's logits are finite, so is the raised shift
        raised = torch.maximum(shift, logits.amax(dim=-1, keepdim=True))
        rescale, fk = torch.exp(shift - raised), torch.exp(logits - raised)
    else:
        logits = _allowed(logits, key_mask)
        raised = torch.maximum(shift, logits.amax(dim=-1, keepdim=True))
        known = torch.isfinite(raised)  # -inf: no allowed key yet, the state is all zeros
        rescale = torch.where(known, torch.exp(shift - raised), 1.0)
        fk = torch.exp(logits - raised.masked_fill(~known, 0.0))
    kv.mul_(rescale).addcmul_(fk.transpose(-2, -1), F.pad(v.to(kv.dtype), (0, 1), value=1.0))
    shift.copy_(raised)
    both = torch.exp(q_logits - q_logits.amax(dim=-1, keepdim=True)) @ kv  # phi(q) shifted by its own largest logit
    numerator, denominator = both[..., :-1], both[..., -1:]
    out = numerator / denominator.masked_fill(denominator == 0, 1.0)
    return merge_heads(out.to(query.dtype)), state


def state_bytes(batch, context, d_model, num_heads, itemsize, features=256, **options):
    """Per head an m x d state, an m normaliser and the shift, in the features' float32 at least."""
    return batch * num_heads * (features * (d_model // num_heads + 1) + 1) * max(itemsize, 4)


def flops(batch, q_len, k_len, d_model, num_heads, features=256, **options):
    """Without is_causal: the random features of queries and keys (2 n m d each), the keys' state with its
    normaliser as a ones column (2 k_len m (d + 1)) and its reads by the queries (2 q_len m (d + 1)), per head."""
    width = d_model // num_heads
    per_head = 2.0 * features * width * (q_len + k_len) + 2.0 * k_len * features * (width + 1) \
        + 2.0 * q_len * features * (width + 1)
    return batch * num_heads * per_head


def matmul_features(module):
    """FAVOR+ non-causal written directly: each side's logits as one matmul with the projection, its features
    shifted by a single largest logit (the query's per query, the keys' over all keys), the normaliser as a ones
    column beside the values. Masks and causal attention go to the module: no plain-torch form of those is
    known to be faster."""
    def run(query, key, value, attn_mask=None, is_causal=False):
        if is_causal or attn_mask is not None or not key.shape[1]:
            return module(query, key, value, attn_mask, is_causal)
        q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
        w = module.projection.transpose(-2, -1)  # (heads, d, features)
        scale = q.shape[-1] ** -0.25
        q_logits, k_logits = ((x * scale) @ w - (x * x).sum(-1, keepdim=True) * (scale * scale / 2) for x in (q, k))
        fq = torch.exp(q_logits - q_logits.detach().amax(-1, keepdim=True))
        fk = torch.exp(k_logits - k_logits.detach().amax())
        out = fq @ (fk.transpose(-2, -1) @ F.pad(v, (0, 1), value=1.0))
        return merge_heads(out[..., :-1] / out[..., -1:])
    return run


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="performer",
        summary="Performer (FAVOR+): positive orthogonal random features approximate softmax in O(n m d).",
        family="linear",
        citation="Choromanski et al. 2021, Rethinking Attention with Performers",
        departures=(
            zoo.Departure("omission",
                          "the random features are drawn once when the module is built and never redrawn; the paper redraws them in training"),
            zoo.Departure("substitution",
                          "independent random features per head; the official code shares one projection across heads"),
            zoo.Departure("substitution",
                          "stabilised by exact shifts over the keys each query may see; the official code adds 1e-4 to the features"),
            zoo.Departure("omission",
                          "only the positive softmax kernel (FAVOR+): no hyperbolic features, no generalised kernels such as ReLU"),
            zoo.Departure("extension",
                          "takes any query-dependent mask, computed in the quadratic form; the paper defines full and causal attention"),
        ),
        factory=PerformerAttention,
        reference=reference,
        approximates="softmax",
        complexity=zoo.Complexity(time=1, memory=1),
        options={"features": 256, "chunk": 64},
        check_options={"features": 16, "chunk": 4},
        baselines={"matmul-features": matmul_features},
        best_known="matmul-features",
        error_sweeps={"features": (16, 64, 256, 1024)},  # what more random features buy
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="fixed", state_bytes=state_bytes),
        random_features=zoo.RandomFeatures(features=features, directions=lambda module: module.projection),
        targets=(
            zoo.Target("decode-growth", at_least=1 / 1.1, at_most=1.1, mode="causal", phase="decode",
                       note="time per generated token constant within 10% from the shortest timed context to the longest"),
            zoo.Target("decode-ratio", versus="sdpa-kv-cache", at_most=0.1, mode="causal", phase="decode", n=16384,
                       note="at least 10x faster per token than softmax over a KV cache at 16384 context"),
            zoo.Target("approximation-error", 0.7, phase="fwd",
                       note="normalised error on structured inputs at most 0.7 at every measured n (256 features)"),
        ),
    ))
