"""Performer attention: FAVOR+ positive orthogonal random features (Choromanski et al. 2021).

softmax(q.k / sqrt(d)) is approximated by phi(q).phi(k) with phi(x) = exp(W x - |x|^2 / 2) / sqrt(m) on
x scaled by d^-1/4, where the m rows of W are blocks of orthogonal directions with Gaussian norms, drawn
once per head when the module is built (a buffer: saved with it, never trained). The attention is then
kernel attention (``zoo.functional.kernel_attention``): O(n m d), causal by prefix sums over chunks.

Numerics: each query's features are shifted by their own maximum and all keys' by one shared maximum
(both cancel in the ratio; the shifts are constants to autograd), and half-precision inputs compute the
features in float32. A decoder cannot know the keys to come, so its state (sum phi(k)^T v and sum phi(k)
per head) keeps the largest key logit seen so far as its shift and is rescaled whenever a new key raises it.
"""

import math

import torch
from torch import nn

import zoo
from zoo.functional import kernel_attention, merge_heads, split_heads
from zoo.reference import positive_kernel_attention, reference_mask


def orthogonal_features(heads: int, features: int, width: int) -> torch.Tensor:
    """(heads, features, width): per head, blocks of ``width`` orthogonal rows, each row with the norm of
    a Gaussian vector (FAVOR+'s orthogonal random features)."""
    blocks = []
    for _ in range(heads):
        rows = []
        for _ in range(-(-features // width)):
            q, _ = torch.linalg.qr(torch.randn(width, width))
            rows.append(q.T)
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
        x = x * x.shape[-1] ** -0.25
        return torch.einsum("bhnd,hmd->bhnm", x, self.projection.to(x.dtype)) - (x * x).sum(-1, keepdim=True) / 2

    def feature_map(self, x, shared_shift: bool):
        """phi(x) on (batch, heads, seq, d), in float32 at least."""
        logits = self.logits(x)
        if shared_shift:  # keys: one shift for all of them, so their relative weights stay
            shift = logits.detach().amax(dim=(-2, -1), keepdim=True) if logits.numel() else 0.0
        else:  # queries: each its own (it cancels between numerator and denominator)
            shift = logits.detach().amax(dim=-1, keepdim=True) if logits.numel() else 0.0
        return torch.exp(logits - shift) / math.sqrt(self.features)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        fq, fk = self.feature_map(q, shared_shift=False), self.feature_map(k, shared_shift=True)
        out = kernel_attention(fq, fk, v.to(fq.dtype), attn_mask, is_causal, self.chunk)
        return merge_heads(out.to(query.dtype))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) with the module's features, in float64,
    without the shifts (they cancel)."""
    h = module.num_heads
    q, k, v = (x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value))
    w = module.projection.double()
    scale = q.shape[-1] ** -0.25

    def phi(x):
        x = x * scale
        return torch.exp(torch.einsum("bhnd,hmd->bhnm", x, w) - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(w.shape[1])

    mask = reference_mask(attn_mask, is_causal, q.shape[2], k.shape[2])
    return positive_kernel_attention(phi(q), phi(k), v, mask).transpose(1, 2).flatten(2)


def prefill(module, query, key, value, key_mask=None):
    """The causal forward over the prompt, and the state its keys leave with the prompt's shift: the largest
    key logit, as the forward takes it (-inf for no prompt: the first step's key then sets it)."""
    q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
    logits = module.logits(k)
    if logits.numel():
        shift = logits.amax(dim=(-2, -1), keepdim=True)
    else:
        shift = logits.new_full((*logits.shape[:2], 1, 1), -math.inf)
    fq, fk = module.feature_map(q, shared_shift=False), torch.exp(logits - shift) / math.sqrt(module.features)
    v = v.to(fq.dtype)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    out = kernel_attention(fq, fk, v, mask, True, module.chunk)
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None].to(fk.dtype)
    state = {"kv": fk.transpose(-2, -1) @ v, "normaliser": fk.sum(-2).unsqueeze(-1), "shift": shift}
    return merge_heads(out.to(query.dtype)), state


def step(module, state, query, key, value, key_mask=None):
    """The next token: the shift raised to its key's largest logit where that is larger (a padding key too, as
    in the forward) and the state rescaled by exp(old - new), exactly 1 where it stays; numerator and
    normaliser scale alike, so the outputs are the forward's. Then its features times its value are added in
    place and its query reads the state."""
    kv, normaliser, shift = state["kv"], state["normaliser"], state["shift"]
    q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
    logits = module.logits(k)
    raised = torch.maximum(shift, logits.amax(dim=-1, keepdim=True))
    rescale = torch.exp(shift - raised)
    fk = (torch.exp(logits - raised) / math.sqrt(module.features)).transpose(-2, -1)  # (b, h, m, 1)
    if key_mask is not None:
        fk = fk * key_mask[:, None, None, :].to(fk.dtype)
    kv.mul_(rescale).addcmul_(fk, v.to(kv.dtype))
    normaliser.mul_(rescale).add_(fk)
    shift.copy_(raised)
    fq = module.feature_map(q, shared_shift=False)
    numerator, denominator = fq @ kv, fq @ normaliser
    out = numerator / denominator.masked_fill(denominator == 0, 1.0)
    return merge_heads(out.to(query.dtype)), state


def state_bytes(batch, context, d_model, num_heads, itemsize, features=256, **options):
    """Per head an m x d state, an m normaliser and the shift, in the features' float32 at least."""
    return batch * num_heads * (features * (d_model // num_heads + 1) + 1) * max(itemsize, 4)


def flops(batch, q_len, k_len, d_model, num_heads, features=256, **options):
    """Without is_causal: the random features of queries and keys (2 n m d each), the keys' state
    (2 k_len m d) and its reads by the queries, values and normaliser (2 q_len m (d + 1)), per head."""
    width = d_model // num_heads
    per_head = 2.0 * features * width * (q_len + k_len) + 2.0 * k_len * features * width \
        + 2.0 * q_len * features * (width + 1)
    return batch * num_heads * per_head


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="performer",
        summary="Performer (FAVOR+): positive orthogonal random features approximate softmax in O(n m d).",
        family="linear",
        citation="Choromanski et al. 2021, Rethinking Attention with Performers",
        factory=PerformerAttention,
        reference=reference,
        approximates="softmax",
        complexity=zoo.Complexity(time=1, memory=1),
        options={"features": 256, "chunk": 64},
        check_options={"features": 16, "chunk": 4},
        error_sweeps={"features": (16, 64, 256, 1024)},  # what more random features buy
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="fixed", state_bytes=state_bytes),
        targets=(
            zoo.Target("decode-growth", at_least=1 / 1.1, at_most=1.1, mode="causal", phase="decode",
                       note="time per generated token constant within 10% from the shortest timed context to the longest"),
            zoo.Target("decode-ratio", versus="sdpa-kv-cache", at_most=0.1, mode="causal", phase="decode", n=16384,
                       note="at least 10x faster per token than softmax over a KV cache at 16384 context"),
            zoo.Target("approximation-error", 0.7, phase="fwd",
                       note="normalised error on structured inputs at most 0.7 at every measured n (256 features)"),
        ),
    ))
