"""Small tensor helpers shared by variants (built-in or third-party): masks, heads, masked SDPA.

Conventions: batch-first ``(batch, seq, dim)`` tensors; boolean masks where True means "may attend",
broadcastable to ``(batch, heads, q_len, k_len)`` like torch SDPA's ``attn_mask``; ``is_causal``
top-left aligned like torch SDPA (query i sees keys j <= i). Rows with no allowed key give zeros.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> Tensor:
    """(q_len, k_len) boolean mask, True where key j <= query i (torch SDPA's alignment)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def combine_masks(attn_mask: Tensor | None, is_causal: bool, q_len: int, k_len: int,
                  device: torch.device | str | None = None) -> Tensor | None:
    """One boolean mask from ``attn_mask`` and ``is_causal`` (both apply), or None when neither is set.
    A 1-D ``attn_mask`` (k_len,) is one row shared by every query, as in torch SDPA."""
    if attn_mask is not None and attn_mask.dim() == 1:
        attn_mask = attn_mask.view(1, -1)
    if not is_causal:
        return attn_mask
    causal = causal_mask(q_len, k_len, device)
    return causal if attn_mask is None else attn_mask & causal


def gathered_mask(attn_mask: Tensor, query_pos: Tensor, key_pos: Tensor, batch: int, heads: int,
                  q_len: int, k_len: int) -> Tensor:
    """The user's ``attn_mask`` read at gathered (query, key) positions, for variants that attend to
    blocks of keys: ``query_pos`` and ``key_pos`` broadcast to the blocked shape (e.g. (blocks, block, 1)
    and (blocks, 1, span)); positions past the sequence are clamped (mask those separately). Returns
    (batch * heads, *blocked) or, for a mask shared by every batch element and head, (*blocked)."""
    if attn_mask.dim() == 1:
        attn_mask = attn_mask.view(1, -1)
    full = attn_mask.expand(*attn_mask.shape[:-2], q_len, k_len)
    while full.dim() < 4:
        full = full.unsqueeze(0)
    local = full[..., query_pos.clamp(0, q_len - 1), key_pos.clamp(0, k_len - 1)]
    if local.shape[0] == 1 and local.shape[1] == 1:
        return local[0, 0]
    return local.expand(batch, heads, *local.shape[2:]).reshape(batch * heads, *local.shape[2:])


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(batch, seq, heads * d) -> (batch, heads, seq, d)."""
    batch, seq, width = x.shape
    return x.view(batch, seq, num_heads, width // num_heads).transpose(1, 2)


def project_qkv(layers, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The query, key and value ``nn.Linear`` layers applied to their inputs; for self-attention (one tensor for
    all three) as one matmul over the concatenated weights, as nn.MultiheadAttention's packed projection does."""
    if not (query is key and key is value):
        return tuple(layer(x) for layer, x in zip(layers, (query, key, value)))
    weight = torch.cat([layer.weight for layer in layers])
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return F.linear(query, weight, bias).split([layer.out_features for layer in layers], dim=-1)


def merge_heads(x: Tensor) -> Tensor:
    """(batch, heads, seq, d) -> (batch, seq, heads * d)."""
    batch, heads, seq, width = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * width)


def masked_sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
    """torch SDPA on (batch, heads, seq, d) with a combinable mask and zeros for fully masked rows.

    A row with no allowed key is given every key before SDPA (so no NaN appears in forward or
    backward) and zeroed afterwards, so it has no influence in either direction. No value is read
    back to the host, so a GPU call never waits for its own kernels. ``enable_gqa``: k and v may have
    fewer heads than q (a divisor of them), as in torch SDPA.
    """
    if attn_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)
    mask = combine_masks(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    return sdpa_zeroing_empty_rows(q, k, v, mask, enable_gqa)


def pattern_sdpa(q: Tensor, k: Tensor, v: Tensor, pattern: Tensor, attn_mask: Tensor | None = None) -> Tensor:
    """torch SDPA under a sparse variant's own pattern (a boolean mask in which every query may attend to some key)
    and the caller's ``attn_mask``: the dense form of a sparse path. The pattern alone goes to SDPA as it is; with
    a mask, a row the two leave empty is zeroed (:func:`sdpa_zeroing_empty_rows`)."""
    if attn_mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=pattern)
    return sdpa_zeroing_empty_rows(q, k, v, pattern & attn_mask)


def sdpa_zeroing_empty_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, enable_gqa: bool = False,
                            bias: Tensor | None = None) -> Tensor:
    """torch SDPA under a boolean mask (True: may attend) that broadcasts to its scores, with zeros for rows
    that may attend to nothing (given every key inside SDPA, so no NaN appears in forward or backward).
    ``bias``: an additive logit bias broadcastable to the scores, applied where the mask allows.

    The empty-row test runs on the mask as given, before SDPA broadcasts it, so it costs the mask's size
    and not batch x heads times it. The mask reaches SDPA 4-D (leading 1s added): a 3-D mask sends torch
    SDPA to its unfused math path. Pass the mask unexpanded: SDPA converts an expanded mask at full size.
    """
    row_ok = mask.any(dim=-1, keepdim=True)
    allowed = mask | ~row_ok
    allowed = allowed.view(*(1,) * (4 - allowed.dim()), *allowed.shape)
    if bias is not None:
        allowed = bias.masked_fill(~allowed, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=enable_gqa)
    return out.masked_fill(~row_ok, 0.0)


def call_torch_mha(mha: torch.nn.MultiheadAttention, query: Tensor, key: Tensor, value: Tensor,
                   attn_mask: Tensor | None = None, is_causal: bool = False,
                   need_weights: bool = False) -> Tensor:
    """Call ``nn.MultiheadAttention(batch_first=True)`` with the zoo's mask convention.

    torch's module takes True as "may NOT attend" and a (q_len, k_len) or (batch * heads, q_len,
    k_len) mask, so the zoo's mask is combined, broadcast and inverted here. When that mask is exactly the
    causal one, the module is also told ``is_causal`` (it takes the hint only beside the mask): it then hands SDPA
    ``is_causal=True`` instead of the mask, and SDPA's causal kernel skips the masked half instead of masking the
    whole square. Its weights (``need_weights``) and its inference fast path still take the mask.
    """
    q_len, k_len = query.shape[1], key.shape[1]
    mask = combine_masks(attn_mask, is_causal, q_len, k_len, query.device)
    if mask is not None:
        if mask.dim() <= 2:
            mask = ~mask.expand(q_len, k_len)
        else:
            shape = (query.shape[0], mha.num_heads, q_len, k_len)
            mask = ~mask.expand(shape).reshape(-1, q_len, k_len)
    exactly_causal = is_causal and attn_mask is None
    return mha(query, key, value, attn_mask=mask, need_weights=need_weights, is_causal=exactly_causal)[0]


def _normalise(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator; rows with no allowed key have both zero and give zero."""
    return numerator / denominator.masked_fill(denominator == 0, 1.0)  # no 0/0, in value or gradient


def kernel_attention(fq: Tensor, fk: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                     chunk: int = 64) -> Tensor:
    """sum_j (fq_i . fk_j) v_j / sum_j fq_i . fk_j over the allowed keys, on (batch, heads, seq, d) feature
    maps that are positive (linear attention's elu + 1, Performer's random features).

    Non-causal: fq (fk^T v) in O(n d^2). Causal: chunks of ``chunk`` tokens, each combining an exclusive
    prefix state (sum of fk^T v over earlier chunks, one cumsum) with a masked product inside the chunk;
    no n x n matrix and no loop in Python, so autograd's backward costs about two forwards. A mask that
    depends only on the key (padding) zeroes those keys' features and stays linear; any other mask falls
    back to the quadratic form of the same kernel.
    """
    q_len, k_len = fq.shape[-2], fk.shape[-2]
    if attn_mask is not None:
        keep = attn_mask if attn_mask.dim() >= 2 else attn_mask.view(1, -1)
        if keep.shape[-2] != 1:  # depends on the query: only the quadratic form can apply it
            return _quadratic_kernel(fq, fk, v, combine_masks(attn_mask, is_causal, q_len, k_len, fq.device))
        fk = fk * keep.transpose(-2, -1).to(fk.dtype)  # key padding: drop those keys' features
    if not is_causal:  # the normaliser rides along with the values as a ones column: one matmul each side
        out = fq @ (fk.transpose(-2, -1) @ F.pad(v, (0, 1), value=1.0))  # (b, h, q_len, d_v + 1)
        return _normalise(out[..., :-1], out[..., -1:])
    if q_len != k_len:
        return _quadratic_kernel(fq, fk, v, combine_masks(None, True, q_len, k_len, fq.device))
    return _causal_chunked(fq, fk, v, chunk)


def _causal_chunked(fq: Tensor, fk: Tensor, v: Tensor, size: int) -> Tensor:
    batch, heads, n, _ = fq.shape
    chunks = -(-n // size)
    pad = chunks * size - n
    v = F.pad(v, (0, 1), value=1.0)  # a ones column: the normaliser rides along with the values
    if pad:
        fq, fk, v = (F.pad(x, (0, 0, 0, pad)) for x in (fq, fk, v))
    fq, fk, v = (x.reshape(batch, heads, chunks, size, x.shape[-1]) for x in (fq, fk, v))
    kv = fk.transpose(-2, -1) @ v  # (b, h, chunks, d, d_v + 1): each chunk's state and normaliser
    # Exclusive prefix over chunks as one cumsum. (A Python loop assigning state[:, :, i] was faster
    # forward, but autograd copied the whole tensor per slice in backward: fwd+bwd took 14.7x the forward
    # at n=16384.)
    state = ExclusivePrefixSum.apply(kv, 2)
    local = (fq @ fk.transpose(-2, -1)).tril()  # (b, h, chunks, size, size)
    out = fq @ state + local @ v
    out = _normalise(out[..., :-1], out[..., -1:])
    return out.reshape(batch, heads, chunks * size, out.shape[-1])[:, :, :n]  # no -1: batch may be 0


class ExclusivePrefixSum(torch.autograd.Function):
    """x[0] + ... + x[i - 1] along ``dim`` (zero at i = 0). Its gradient, the sum over the later positions,
    is the total minus an inclusive cumsum: one pass, where autograd's cumsum backward flips the gradient,
    sums and flips it back (two full copies of the chunk states)."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int) -> Tensor:
        ctx.dim = dim
        return x.cumsum(dim).sub_(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad.sum(ctx.dim, keepdim=True) - grad.cumsum(ctx.dim), None


def _quadratic_kernel(fq: Tensor, fk: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    scores = fq @ fk.transpose(-2, -1)
    if mask is not None:
        scores = scores * mask
    return _normalise(scores @ v, scores.sum(dim=-1, keepdim=True))


def exp_kernel_attention(fq: Tensor, key_logits: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                         is_causal: bool = False, chunk: int = 64) -> Tensor:
    """:func:`kernel_attention` with key features exp(``key_logits``) (Performer's random features), kept in range
    by shifts taken only over the keys each query may attend, so a masked or future key with large logits cannot
    flush an allowed key's features to zero (nor make them overflow).

    Each key's features are computed relative to their own largest logit M_j, and query i weighs key j by
    exp(M_j - s_i) <= 1, s_i the largest M_j among its allowed keys; s_i is one number per query, so it cancels
    between numerator and denominator and the result is the unshifted kernel's. The shifts are constants to
    autograd. Causal (q_len = k_len, no mask or key padding): s_i is a running maximum; chunks of ``chunk`` tokens
    combine a masked product inside the chunk with a state carried across chunks and rescaled as the maximum rises
    (one Python step per chunk). Any other query-dependent mask takes the quadratic form.
    """
    q_len, k_len = fq.shape[-2], key_logits.shape[-2]
    if attn_mask is not None:
        keep = attn_mask if attn_mask.dim() >= 2 else attn_mask.view(1, -1)
        if keep.shape[-2] != 1:  # depends on the query: the quadratic form
            return _quadratic_exp_kernel(fq, key_logits, v, combine_masks(attn_mask, is_causal, q_len, k_len, fq.device))
        key_logits = key_logits.masked_fill(~keep[..., 0, :, None], -torch.inf)  # key padding: no features at all
    if is_causal and q_len != k_len:  # padding, if any, is in the logits now
        return _quadratic_exp_kernel(fq, key_logits, v, causal_mask(q_len, k_len, fq.device))
    if not is_causal:  # every query sees the same keys: one shift for all of them
        shift = _finite(key_logits.detach().amax(dim=(-2, -1), keepdim=True)) if key_logits.numel() else 0.0
        out = fq @ (torch.exp(key_logits - shift).transpose(-2, -1) @ F.pad(v, (0, 1), value=1.0))  # a ones column
        return _normalise(out[..., :-1], out[..., -1:])
    peak, fk = _per_key(key_logits)
    return _causal_exp_chunked(fq, fk, peak, v, chunk)[0]


def _per_key(key_logits: Tensor) -> tuple[Tensor, Tensor]:
    """Each key's largest logit M_j (-inf for a padding key) and its features relative to it (at most 1)."""
    peak = key_logits.detach().amax(dim=-1) if key_logits.shape[-1] else key_logits.new_zeros(key_logits.shape[:-1])
    return peak, torch.exp(key_logits - _finite(peak).unsqueeze(-1))


def _finite(shift: Tensor) -> Tensor:
    """A shift of -inf (no allowed key) as 0: the weights it would scale are all zero."""
    return shift.masked_fill(torch.isinf(shift), 0.0)


def _quadratic_exp_kernel(fq: Tensor, key_logits: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    peak, fk = _per_key(key_logits)
    exponent = peak.unsqueeze(-2).masked_fill(~mask, -torch.inf)  # (b, h, q, k): M_j where query i may attend
    shift = _finite(exponent.amax(dim=-1, keepdim=True)) if exponent.shape[-1] else 0.0
    scores = (fq @ fk.transpose(-2, -1)) * torch.exp(exponent - shift)
    return _normalise(scores @ v, scores.sum(dim=-1, keepdim=True))


def continue_exp_kernel(fq: Tensor, key_logits: Tensor, v: Tensor, state: Tensor, shift: Tensor,
                        chunk: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """Causal :func:`exp_kernel_attention` of a segment that follows earlier keys, and the state it leaves: what a
    decoder's prefill needs to take a long prompt a piece at a time (memory for one piece, not the prompt).
    ``state`` (batch, heads, m, d + 1) is the earlier keys' sum of exp(logits - ``shift``) [v, 1], ``shift``
    (batch, heads) their largest logit (-inf for none, with a zero state); every query of the segment reads it.
    ``key_logits`` are -inf for padding keys. Returns the segment's output and the state and shift after its last
    key, in the same form."""
    peak, fk = _per_key(key_logits)
    return _causal_exp_chunked(fq, fk, peak, v, chunk, state, shift)


def _causal_exp_chunked(fq: Tensor, fk: Tensor, peak: Tensor, v: Tensor, size: int, state: Tensor | None = None,
                        start: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    batch, heads, n, _ = fq.shape
    if state is None:
        state = fq.new_zeros(batch, heads, fk.shape[-1], v.shape[-1] + 1)
        start = fq.new_full((batch, heads), -torch.inf)
    if n == 0:
        return v * 0.0, state, start  # empty, and still in the graph: a backward through it runs
    chunks = -(-n // size)
    pad = chunks * size - n
    v = F.pad(v, (0, 1), value=1.0)  # a ones column: the normaliser rides along with the values
    if pad:
        fq, fk, v = (F.pad(x, (0, 0, 0, pad)) for x in (fq, fk, v))
        peak = F.pad(peak, (0, pad), value=-torch.inf)
    running = torch.maximum(peak.cummax(dim=-1).values, start.unsqueeze(-1))  # the largest M_j for j <= i
    shift = _finite(running)  # s_i
    fq, fk, v = (x.reshape(batch, heads, chunks, size, x.shape[-1]) for x in (fq, fk, v))
    peak, shift = peak.view(batch, heads, chunks, size), shift.view(batch, heads, chunks, size)
    local = (fq @ fk.transpose(-2, -1)) * torch.exp((peak.unsqueeze(-2) - shift.unsqueeze(-1)).clamp(max=0)).tril()
    end = shift[..., -1]  # (b, h, chunks): each chunk's state is kept relative to the shift at its last position
    kv = (fk * torch.exp(peak - end.unsqueeze(-1)).unsqueeze(-1)).transpose(-2, -1) @ v  # (b, h, chunks, m, d + 1)
    before = torch.cat((start.unsqueeze(-1), end[..., :-1]), dim=-1)  # the shift the state entering each chunk is at
    carry = torch.exp((before - end).clamp(max=0))  # rescale from one chunk's entry to its end (0 from none)
    states = []
    for index, chunk_kv in enumerate(kv.unbind(2)):  # a rising maximum rescales the state: no cumsum can
        states.append(state)
        state = state * carry[..., index, None, None] + chunk_kv
    entering = torch.stack(states, 2)
    read = torch.exp((before.unsqueeze(-1) - shift).clamp(max=0)).unsqueeze(-1)  # (b, h, chunks, size, 1)
    out = (fq @ entering) * read + local @ v
    out = _normalise(out[..., :-1], out[..., -1:])
    return out.reshape(batch, heads, chunks * size, out.shape[-1])[:, :, :n], state, running[..., -1]


def projected_sdpa(q: Tensor, k: Tensor, v: Tensor, num_heads: int, attn_mask: Tensor | None, is_causal: bool,
                   out_proj) -> Tensor:
    """Heads split, torch's fused SDPA with the zoo's mask convention, heads merged, then ``out_proj``: the
    forward of every layer that is projections around softmax attention, after its input projections."""
    out = masked_sdpa(split_heads(q, num_heads), split_heads(k, num_heads), split_heads(v, num_heads), attn_mask, is_causal)
    return out_proj(merge_heads(out))


def torch_mha_baseline(need_weights: bool, arguments, state):
    """A baseline builder: ``nn.MultiheadAttention(**arguments(module))`` holding ``state(module, mha)`` (the
    layer's own tensors, shared, not copied), on the layer's device, dtype and mode, called with the zoo's masks."""

    def build(module):
        mha = torch.nn.MultiheadAttention(**arguments(module), batch_first=True)
        mha.load_state_dict(state(module, mha), assign=True)  # shares the tensors: works on any device
        held = next(module.parameters())
        mha.to(held.device, held.dtype).train(module.training)

        def run(query, key, value, attn_mask=None, is_causal=False):
            return call_torch_mha(mha, query, key, value, attn_mask, is_causal, need_weights)

        return run

    return build


LOGSUMEXP_DEVICES = ("cpu",)
"""The devices :func:`sdpa_with_sink` takes a fused kernel's logsumexp on (torch's CPU flash kernel)."""


def _fused_with_sink(q, k, v, sink, mask, is_causal, scale):
    """The fused CPU kernel's output and each row's logsumexp L, and the row's weight left beside the sink,
    sigmoid(L - sink); the output with the sink is the kernel's times that factor. A row with no key comes back
    from the kernel as zeros (with L = 0; a kernel that gives L = -inf instead has its row zeroed here); a NaN
    from the inputs is kept, as torch SDPA keeps it."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=mask,
                                                                            scale=scale)
    empty = lse.isneginf().unsqueeze(-1)
    kept = torch.sigmoid(lse - sink.to(lse.dtype).view(1, -1, 1)).unsqueeze(-1).masked_fill(empty, 0.0)
    return out.mul_(kept.to(out.dtype)).masked_fill_(empty, 0.0), lse, kept


class _FusedSinkAttention(torch.autograd.Function):
    """:func:`sdpa_with_sink` with gradients on torch's fused CPU kernel (:func:`_fused_with_sink`). Backward: the
    kernel's own backward, given the output with the sink and the incoming gradient times the factor, yields
    exactly the gradients of q, k and v (the factor's dependence on the scores through L cancels into the
    kernel's rowsum term); the sink's gradient is -sum over rows of (grad . output) (1 - factor)."""

    @staticmethod
    def forward(ctx, q, k, v, sink, mask, is_causal, scale):
        out, lse, kept = _fused_with_sink(q, k, v, sink, mask, is_causal, scale)
        lse = lse.masked_fill(lse.isneginf(), float("inf"))  # a row with no key: exp(score - L) = 0, no gradient
        ctx.save_for_backward(q, k, v, out, lse, kept, mask)
        ctx.is_causal, ctx.scale, ctx.sink_dtype = is_causal, scale, sink.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, kept, mask = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            (grad * kept.to(grad.dtype)).contiguous(), q, k, v, out, lse, 0.0, ctx.is_causal, attn_mask=mask,
            scale=ctx.scale)
        rows = (grad.to(kept.dtype) * out.to(kept.dtype)).sum(-1, keepdim=True)  # factor x (grad . sink-free out)
        dsink = -(rows * (1 - kept)).sum(dim=(0, 2, 3)).to(ctx.sink_dtype)
        return dq, dk, dv, dsink, None, None, None


def sdpa_with_sink(q: Tensor, k: Tensor, v: Tensor, sink: Tensor, attn_mask: Tensor | None = None,
                   is_causal: bool = False) -> Tensor:
    """Softmax attention of (batch, heads, n, d) tensors with one more logit per head, ``sink`` (heads,), in every
    row's denominator and no value of its own (learned attention sinks: :func:`softmax_with_sink`, as one fused
    call); a row with no key to attend to gives zeros. ``attn_mask``: boolean (True: may attend) or a float added
    to the scores, broadcastable like torch SDPA's; with ``is_causal`` both apply. On CPU, torch's fused kernel
    and its logsumexp (:func:`_fused_with_sink`); elsewhere, the sink as one more key on fused SDPA: heads one
    feature wider, queries ``[q, 1]``, keys ``[k, 0]`` after a sink key ``[0, s sqrt d]`` with a zero value, and a
    zero query row first, which keeps ``is_causal`` aligned (also where values are narrower or wider than
    queries, or a float mask needs its own gradient, which the fused kernel does not give)."""
    batch, heads, q_len, d = q.shape
    scale = d ** -0.5
    if q.numel() == 0 or k.shape[-2] == 0:  # no query, or only the sink to attend to (the fused CPU kernel would
        # divide by zero): zeros, still in the graph
        return q.new_zeros(batch, heads, q_len, v.shape[-1]) + (q.sum() + k.sum() + v.sum() + sink.sum()) * 0.0
    if attn_mask is not None:  # one additive mask: the fused kernels take a mask or is_causal, not both
        if attn_mask.dtype == torch.bool:
            allowed = combine_masks(attn_mask, is_causal, q_len, k.shape[-2], q.device)
            attn_mask = torch.where(allowed, 0.0, float("-inf")).to(q.dtype)
        else:
            attn_mask = attn_mask.to(q.dtype)
            if is_causal:
                attn_mask = attn_mask.masked_fill(~causal_mask(q_len, k.shape[-2], q.device), float("-inf"))
        attn_mask, is_causal = attn_mask.view(*(1,) * (4 - attn_mask.dim()), *attn_mask.shape), False
    fused = q.device.type in LOGSUMEXP_DEVICES and v.shape[-1] == d and not (
        attn_mask is not None and attn_mask.requires_grad)
    if fused:
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, sink)):
            return _FusedSinkAttention.apply(q, k, v, sink, attn_mask, is_causal, scale)
        return _fused_with_sink(q, k, v, sink, attn_mask, is_causal, scale)[0]  # a decode step: no graph to keep
    wide_q = F.pad(F.pad(q, (0, 1), value=1.0), (0, 0, 1, 0))
    sink_key = F.pad((sink / scale).to(k.dtype).view(1, heads, 1, 1).expand(batch, heads, 1, 1), (d, 0))
    wide_k = torch.cat([sink_key, F.pad(k, (0, 1))], dim=-2)
    wide_v = F.pad(v, (0, 1, 1, 0))  # one head width for all three keeps SDPA on its fused kernel
    if attn_mask is not None:  # the sink is always allowed, so no row is empty
        attn_mask = attn_mask.expand(*attn_mask.shape[:-1], k.shape[-2])
        attn_mask = F.pad(attn_mask, (1, 0) if attn_mask.shape[-2] == 1 else (1, 0, 1, 0), value=0.0)
    out = F.scaled_dot_product_attention(wide_q, wide_k, wide_v, attn_mask=attn_mask, is_causal=is_causal,
                                         scale=scale)
    return out[..., 1:, :v.shape[-1]]


def softmax_with_sink(scores: Tensor, sink: Tensor) -> Tensor:
    """Softmax weights of (batch, heads, q_len, k_len) ``scores`` (-inf where a key is masked) with one more logit
    per head, ``sink`` (heads,), in each row's denominator and no value of its own: a row's weights sum to less
    than 1, and a row with no key gives zeros (learned attention sinks)."""
    column = sink.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


DENSE_FRACTION = 0.7  # from this share of the dense scores on (padding included), one fused dense call is as fast as
# a blocked sparse path's gathers, padding and extra calls: at n = 512 (d_model 512, 8 heads, the 2-core CPU the board
# runs on) windowed's and block-sparse's blocked paths computed 0.75 / 0.78 of the dense scores and took 1.0-1.17x /
# 1.06-1.11x the fused call's time; at n = 1024 they took 0.45-0.61x of it


def check_dense_fraction(fraction) -> None:
    """A sparse variant's ``dense_fraction`` option: a positive number, or None (never the dense call)."""
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not fraction > 0):
        raise ValueError(f"dense_fraction must be a positive number or None, got {fraction!r}")


def dense_call_pays(sparse_scores: float, dense_scores: float, fraction: float | None) -> bool:
    """Whether a sparse path that would compute ``sparse_scores`` (padding included) should give way to one fused
    dense call computing ``dense_scores`` with the pattern as a mask: from ``fraction`` of them on (None: never).
    Short sequences reach it: there every block reads nearly every other. Inside :func:`dense_shortcuts` the answer
    is also counted, or always no."""
    pays = fraction is not None and dense_scores > 0 and sparse_scores >= fraction * dense_scores
    watch = _SHORTCUTS.get()
    if watch is None:
        return pays
    watch.taken += pays and watch.allowed
    return pays and watch.allowed


@dataclass
class ShortcutWatch:
    """What :func:`dense_shortcuts` saw: whether the dense call was ``allowed`` and how often it was ``taken``."""

    allowed: bool
    taken: int = 0


_SHORTCUTS: ContextVar[ShortcutWatch | None] = ContextVar("dense_shortcuts", default=None)


@contextmanager
def dense_shortcuts(allowed: bool = True):
    """Within it, :func:`dense_call_pays` counts the dense calls it grants or, with ``allowed=False``, grants none,
    so a sparse path never gives way to its dense form: the correctness suite's long-sequence check then compares the
    blocked path at the variant's default sizes with the reference, which at its length the shortcut would hide."""
    watch = ShortcutWatch(allowed)
    token = _SHORTCUTS.set(watch)
    try:
        yield watch
    finally:
        _SHORTCUTS.reset(token)


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int) -> Tensor:
    """Causal softmax attention over the band 0 <= i - j <= ``window`` on (batch, heads, n, d), in O(n window):
    query blocks of ``window``, each against its own and the previous block's keys (2 window keys) under one band
    mask, in fused SDPA (nothing (n, n) is built). Keys and values of one head serve every query head (as in
    multi-query attention): the heads then become rows of one SDPA call, so the keys are not copied per head."""
    batch, heads, n, width = q.shape
    if n == 0:
        return q * 0.0 + v.sum() * 0.0  # an output still in the graph
    shared = k.shape[1] == 1 and heads > 1
    blocks = -(-n // window)
    pad = blocks * window - n

    def spans(x):  # (batch * blocks, heads, 2 window, d): the previous block's positions, then the block's own
        x = F.pad(x, (0, 0, window, pad)).unflatten(2, (blocks + 1, window))
        return torch.cat([x[:, :, :-1], x[:, :, 1:]], dim=3).transpose(1, 2).flatten(0, 1)

    queries = F.pad(q, (0, 0, 0, pad)).unflatten(2, (blocks, window)).transpose(1, 2).flatten(0, 1)
    if shared:  # (batch * blocks, 1, window * heads, d): position-major rows, each position's heads together
        queries = queries.transpose(1, 2).flatten(1, 2).unsqueeze(1)
    r = torch.arange(window, device=q.device).view(1, window, 1)
    c = torch.arange(2 * window, device=q.device).view(1, 1, -1)
    first = torch.arange(blocks, device=q.device).view(blocks, 1, 1) == 0
    band = (c - r >= 0) & (c - r <= window) & ~(first & (c < window))  # (blocks, window, 2 window)
    if shared:
        band = band.repeat_interleave(heads, dim=1)
    mask = band.unsqueeze(1).repeat(batch, 1, 1, 1)  # no key before the sequence's start
    out = F.scaled_dot_product_attention(queries, spans(k), spans(v), attn_mask=mask)
    if shared:
        out = out.view(batch * blocks, window, heads, width).transpose(1, 2)
    return out.unflatten(0, (batch, blocks)).transpose(1, 2).flatten(2, 3)[:, :, :n]


def extend_cache(state: dict, new: dict[str, Tensor], key_mask: Tensor | None = None, sequence_dim: int = 2,
                 name: str = "") -> tuple[dict, int]:
    """The decode state with the next positions' entries appended: each tensor of ``new`` (``{name}{entry}``,
    along ``sequence_dim``) and, once a key is masked, the (batch, length) ``{name}key_mask`` (``key_mask``:
    (batch, t), False for a padding key). Returns the new state and how many positions it held before."""
    from .decoding import append

    state, (entry, first) = dict(state), next(iter(new.items()))
    before = state[f"{name}{entry}"].shape[sequence_dim] if f"{name}{entry}" in state else 0
    for entry, tensor in new.items():
        state[f"{name}{entry}"] = append(state.get(f"{name}{entry}"), tensor, sequence_dim)
    if key_mask is not None or f"{name}key_mask" in state:
        batch, t = first.shape[0], first.shape[sequence_dim]
        kept = state.get(f"{name}key_mask", torch.ones(batch, before, dtype=torch.bool, device=first.device))
        added = torch.ones(batch, t, dtype=torch.bool, device=first.device) if key_mask is None else key_mask
        state[f"{name}key_mask"] = append(kept, added.to(torch.bool), 1)
    return state, before


def cache_allowed(state: dict, t: int, before: int, device: torch.device | str | None = None,
                  name: str = "") -> Tensor:
    """Which cached keys each of the last ``t`` queries may attend to: keys up to its own position (the causal
    forward's alignment), less any masked one; (t, total) or, with a key mask, (batch, 1, t, total)."""
    mask = state.get(f"{name}key_mask")
    allowed = torch.ones(t, before + t, dtype=torch.bool, device=device).tril(before)  # query i: keys <= before + i
    return allowed if mask is None else allowed & mask[:, None, None, :]


def cached_attention(state: dict, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None,
                     enable_gqa: bool = False, name: str = "", key_bias: Tensor | None = None,
                     sink: Tensor | None = None) -> tuple[Tensor, dict]:
    """Softmax attention of new positions over a KV cache, the decode step of every softmax variant.

    ``q``, ``k``, ``v``: (batch, heads, t, d) for the next t positions of the sequence (t = 0 to the whole prompt);
    their keys and values are appended to the cache in ``state`` (entries ``{name}k``, ``{name}v`` and, once a
    key is masked, ``{name}key_mask``: a variant with two caches names them apart), and each new query attends to
    the cached keys up to its own position (the causal forward's alignment). ``key_mask``: (batch, t), False for a
    padding key. ``key_bias``: (batch, heads, t), a logit added for each new key wherever it is attended to,
    cached beside it as ``{name}key_bias`` (a bias ``b_i + b_j`` needs only its key part: softmax is blind to a
    query's constant). ``sink``: (heads,) logits of learned attention sinks (:func:`sdpa_with_sink`). Returns the new positions' outputs
    (zeros for a query with no key to attend to) and the state.
    """
    new = {"k": k, "v": v, **({"key_bias": key_bias} if key_bias is not None else {})}
    state, before = extend_cache(state, new, key_mask, sequence_dim=2, name=name)
    t = q.shape[-2]
    if t == 0:
        return q.new_zeros(*q.shape[:-1], v.shape[-1]), state
    keys, values = state[f"{name}k"], state[f"{name}v"]
    bias = state[f"{name}key_bias"].unsqueeze(-2) if key_bias is not None else None
    if f"{name}key_mask" not in state and bias is None and sink is None:
        if t == 1:
            return F.scaled_dot_product_attention(q, keys, values, enable_gqa=enable_gqa), state
        if before == 0:
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=enable_gqa), state
    allowed = cache_allowed(state, t, before, q.device, name)
    if sink is None:
        return sdpa_zeroing_empty_rows(q, keys, values, allowed, enable_gqa, bias), state
    if enable_gqa:
        keys, values = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (keys, values))
    if bias is not None:
        allowed = torch.where(allowed, bias.to(q.dtype), float("-inf"))
    elif t == 1 and f"{name}key_mask" not in state:
        allowed = None  # one new query sees every cached key
    return sdpa_with_sink(q, keys, values, sink, allowed), state
