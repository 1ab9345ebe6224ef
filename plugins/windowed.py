"""Sliding-window (local) attention: each query sees the keys within ``window`` positions.

Computed on blocks: the queries are cut into blocks of ``block``, and each block attends, in one
batched SDPA call, to its own keys plus ``window`` on either side (only earlier ones when causal)
under one (block, span) band mask. The blocks and their overlapping key windows are strided views of
the caller's tensors, so nothing is copied but the few blocks at the edges. Time and memory are
O(n * window): no n x n mask or score matrix. A sequence short enough that the blocks would compute at
least ``dense_fraction`` of the n x n scores anyway (n up to about 3 window with the defaults) takes one fused
SDPA call with the dense band instead: the blocks' edge padding and several calls then cost more than the
scores they skip. Decoding keeps only the last ``window`` keys and values, all a later query can see.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import (DENSE_FRACTION, check_dense_fraction, dense_call_pays, gathered_mask, merge_heads,
                            pattern_sdpa, sdpa_zeroing_empty_rows, split_heads)
from zoo.reference import reference_mask, softmax_attention


class WindowedAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, window: int = 128, block: int = 32,
                 dense_fraction: float | None = DENSE_FRACTION):
        super().__init__()
        for label, value in (("window", window), ("block", block)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        check_dense_fraction(dense_fraction)
        self.d_model, self.num_heads, self.window, self.block = d_model, num_heads, window, block
        self.dense_fraction = dense_fraction

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        batch, n, _ = query.shape
        block, left = self.block, self.window
        right = 0 if is_causal else self.window
        blocks = -(-n // block)
        if dense_call_pays(blocks * block * (block + left + right), n * n, self.dense_fraction):
            return self._dense(query, key, value, attn_mask, is_causal)
        # Query i = b * block + r meets key j = b * block - left + c: allowed when j - i lies in
        # [-window, right]. Interior blocks, whose keys all exist (first key b * block - left >= 0, last
        # b * block + block + right - 1 < n), share one (block, span) band: a 2-D mask torch's fused kernel
        # takes, on views of the caller's tensors. The edges and a user's mask need a mask per block.
        # Worked out from the sizes: no value is read back from the device.
        first = min(blocks, -(-left // block))
        last = first
        if attn_mask is None and batch > 0 and n >= block + right:
            last = max(first, min(blocks, (n - block - right) // block + 1))
        r = torch.arange(block, device=query.device).view(block, 1)
        c = torch.arange(block + left + right, device=query.device).view(1, -1)
        band = ((c - r - left) >= -self.window) & ((c - r - left) <= right)
        pieces = []
        if first > 0:
            pieces.append(self._edge(query, key, value, 0, first, band, attn_mask))
        if last > first:
            pieces.append(self._interior(query, key, value, first, last, band))
        if last < blocks:
            pieces.append(self._edge(query, key, value, last, blocks, band, attn_mask))
        if not pieces:  # an empty sequence: an output still in the graph
            return value * 0.0
        return torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]

    def _dense(self, query, key, value, attn_mask, is_causal):
        """One fused SDPA call over the whole sequence with the dense (n, n) band (and the user's mask)."""
        mask = band_mask(self, query.shape[1], is_causal, query.device)
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        return merge_heads(pattern_sdpa(q, k, v, mask, attn_mask))

    def _interior(self, query, key, value, first, last, band):
        """Query blocks [first, last) as (blocks, heads, block, d) views of the (seq, heads * d) rows and
        their overlapping key windows as (blocks, heads, span, d) views: SDPA reads the caller's tensors in
        place and writes its output already in (seq, heads * d) order, so nothing is copied."""
        heads, block, span = self.num_heads, self.block, band.shape[-1]
        start, stop, left = first * block, last * block, self.window
        right = span - block - left
        outputs = []
        for q, k, v in zip(query, key, value):  # one call per batch element: (batch, blocks) has no single stride
            q_blocks = q[start:stop].unflatten(0, (last - first, block)).unflatten(-1, (heads, -1)).transpose(1, 2)
            k_windows, v_windows = (
                x[start - left:stop + right].unfold(0, span, block)
                .unflatten(1, (heads, -1)).transpose(-1, -2)
                for x in (k, v)
            )
            out = F.scaled_dot_product_attention(q_blocks, k_windows, v_windows, attn_mask=band)
            outputs.append(out.transpose(1, 2).flatten(2).flatten(0, 1))
        return torch.stack(outputs) if len(outputs) > 1 else outputs[0].unsqueeze(0)

    def _edge(self, query, key, value, start, stop, band, attn_mask):
        """Query blocks [start, stop) with a mask per block (4-D, so torch's fused kernel still applies):
        the edges, whose windows reach past the keys (padded with zeros and masked out), or every
        block under a user's mask. Rows with no allowed key give zeros."""
        batch, n, _ = query.shape
        heads, block, left, span = self.num_heads, self.block, self.window, band.shape[-1]
        blocks, rows = stop - start, min(stop * block, n) - start * block
        key_lo, key_hi = start * block - left, (stop - 1) * block - left + span  # the rows the windows cover
        q_blocks = F.pad(split_heads(query[:, start * block:start * block + rows], heads),
                         (0, 0, 0, blocks * block - rows)).reshape(batch * heads, blocks, block, query.shape[-1] // heads)
        k_windows, v_windows = (
            F.pad(split_heads(x[:, max(key_lo, 0):min(key_hi, n)], heads), (0, 0, max(0, -key_lo), max(0, key_hi - n)))
            .unfold(2, span, block).transpose(-1, -2).reshape(batch * heads, blocks, span, x.shape[-1] // heads)
            for x in (key, value)
        )
        key_pos = torch.arange(start, stop, device=query.device).view(blocks, 1) * block - left \
            + torch.arange(span, device=query.device).view(1, span)
        mask = band & ((key_pos >= 0) & (key_pos < n)).unsqueeze(1)  # (blocks, block, span)
        if attn_mask is not None:
            query_pos = torch.arange(start * block, stop * block, device=query.device).view(blocks, block, 1)
            mask = mask & gathered_mask(attn_mask, query_pos, key_pos.unsqueeze(1), batch, heads, n, n)
        out = sdpa_zeroing_empty_rows(q_blocks, k_windows, v_windows, mask)
        out = out.view(batch, heads, blocks * block, value.shape[-1] // heads)
        return merge_heads(out[:, :, :rows])


def band_mask(module, n, is_causal, device=None):
    """The dense (n, n) band this variant computes sparsely: |i - j| <= window, j <= i when causal."""
    i = torch.arange(n, device=device).view(n, 1)
    j = torch.arange(n, device=device).view(1, n)
    upper = 0 if is_causal else module.window
    return (j - i >= -module.window) & (j - i <= upper)


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    h, n = module.num_heads, query.shape[1]
    mask = band_mask(module, n, is_causal)
    if attn_mask is not None:
        mask = mask & attn_mask
    heads = [x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value)]
    return softmax_attention(*heads, reference_mask(mask, False, n, n)).transpose(1, 2).flatten(2)


def prefill(module, query, key, value, key_mask=None):
    """The prompt through the causal forward; its last ``window`` keys and values, all a later query can see,
    at the start of buffers of twice the window that the steps slide along."""
    p, window = query.shape[1], module.window
    output = module(query, key, value, attn_mask=None if key_mask is None else key_mask[:, None, None, :],
                    is_causal=True)
    kept = p - min(p, window)
    state = {}
    for name, x in (("k", key), ("v", value)):
        state[name] = _buffered(split_heads(x, module.num_heads)[:, :, kept:], window, 2)
    if key_mask is not None:
        state["key_mask"] = _buffered(key_mask[:, kept:].to(torch.bool), window, 1)
    return output, state


def step(module, state, query, key, value, key_mask=None):
    """The next query over the cached window and its own key (window + 1 keys, contiguous, one SDPA call); the
    oldest then leaves the cache, since no later query sees it."""
    window = module.window
    q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
    keys, values = _slide(state["k"], k, 2), _slide(state["v"], v, 2)
    state = dict(state)
    if key_mask is None and "key_mask" not in state:
        out = F.scaled_dot_product_attention(q, keys, values)
    else:
        ones = functools.partial(torch.ones, q.shape[0], dtype=torch.bool, device=q.device)
        kept = state["key_mask"] if "key_mask" in state else _buffered(ones(state["k"].shape[2]), window, 1)
        allowed = _slide(kept, ones(1) if key_mask is None else key_mask.to(torch.bool), 1)
        out = sdpa_zeroing_empty_rows(q, keys, values, allowed[:, None, None, :])
        state["key_mask"] = _last(allowed, window, 1)
    state["k"], state["v"] = _last(keys, window, 2), _last(values, window, 2)
    return merge_heads(out), state


def _buffered(x, window, dim):
    """``x`` copied to the start of a buffer of ``2 * window`` positions along ``dim``, as a view of its part."""
    shape = list(x.shape)
    shape[dim] = 2 * window
    buffer = x.new_empty(shape)
    buffer.narrow(dim, 0, x.shape[dim]).copy_(x)
    return buffer.narrow(dim, 0, x.shape[dim])


def _last(x, window, dim):
    """The last ``window`` positions of ``x`` along ``dim`` (all of them while it is shorter), a view."""
    length = min(x.shape[dim], window)
    return x.narrow(dim, x.shape[dim] - length, length)


def _slide(cache, new, dim):
    """``cache`` (a view of part of a :func:`_buffered` buffer) with ``new`` written right after it, as one view.
    At the buffer's end the cache is first copied back to its start: once every ``window`` steps, O(1) a step
    amortised."""
    buffer_shape = list(cache.shape)
    buffer_shape[dim] = cache.stride(dim - 1) // cache.stride(dim)
    buffer = cache.as_strided(buffer_shape, cache.stride(), 0)
    start, length = cache.storage_offset() // cache.stride(dim), cache.shape[dim]
    if start + length == buffer_shape[dim]:
        buffer.narrow(dim, 0, length).copy_(cache)
        start = 0
    buffer.narrow(dim, start + length, 1).copy_(new)
    return buffer.narrow(dim, start, length + 1)


def cache_bytes(batch, context, d_model, num_heads, itemsize, window=128, **options):
    return 2 * batch * min(context, window) * d_model * itemsize  # the last window keys and values


def dense_band_sdpa(module):
    """A baseline: torch's fused SDPA over the full sequence with the dense band mask."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        h, n = module.num_heads, query.shape[1]
        mask = band_mask(module, n, is_causal, query.device)
        if attn_mask is not None:
            mask = mask & attn_mask
        q, k, v = (split_heads(x, h) for x in (query, key, value))
        return merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))

    return run


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)  # one compilation for every length


@functools.lru_cache(maxsize=16)
def _sliding_block_mask(window: int, is_causal: bool, n: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def in_window(batch, head, q_index, k_index):
        return (q_index - k_index <= window) & (k_index - q_index <= (0 if is_causal else window))

    return create_block_mask(in_window, None, None, n, n, device=device)


def flex_sliding_window(module):
    """A peer: FlexAttention (torch.nn.attention.flex_attention) with a sliding-window block mask, compiled
    with torch.compile, as PyTorch's documentation writes a sliding window. Needs torch.compile to work
    here (a C++ compiler on CPU); the block mask is built once per length, outside the timed calls."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        if attn_mask is not None:
            raise ValueError("the FlexAttention peer is timed without a user mask")
        block_mask = _sliding_block_mask(module.window, is_causal, query.shape[1], str(query.device))
        # forward only (a peer is timed in the forward pass), and FlexAttention refuses inputs that require
        # grad on CPU: it has no CPU backward
        q, k, v = (split_heads(x.detach(), module.num_heads) for x in (query, key, value))
        return merge_heads(_compiled_flex()(q, k, v, block_mask=block_mask))

    return run


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="windowed",
        summary="Sliding-window local attention computed on blocks in O(n * window) time and memory.",
        family="sparse",
        citation="Beltagy et al. 2020, Longformer: The Long-Document Transformer",
        departures=(
            zoo.Departure("convention",
                          "window counts keys on each side (2 window + 1 in all); Longformer's w is the total, so its w = 2 x window"),
            zoo.Departure("omission", "no dilated windows and no global attention tokens (with their own projections)"),
            zoo.Departure("omission", "one window for every head and layer; the paper grows it with depth"),
        ),
        factory=WindowedAttention,
        reference=reference,
        tags=zoo.Tags(allows_different_lengths=False, key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"window": 128, "block": 128, "dense_fraction": DENSE_FRACTION},
        # the small shapes check the blocked path; its dense path is checked at the defaults (long sequences)
        check_options={"window": 3, "block": 4, "dense_fraction": None},
        quality_options={"window": 16, "block": 16},  # the quality tasks are 16-144 tokens: 128 would be dense there
        baselines={"torch-sdpa-band": dense_band_sdpa},
        best_known="torch-sdpa-band",
        peers={"flex-attention": flex_sliding_window},
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="window", state_bytes=cache_bytes),
        targets=(
            zoo.Target("decode-growth", at_least=1 / 1.1, at_most=1.1, mode="causal", phase="decode",
                       note="beyond its window, time per generated token constant within 10% as the context grows"),
            zoo.Target("state-growth", at_most=1.0, mode="causal", phase="decode",
                       note="beyond its window, its cache does not grow with the context"),
            zoo.Target("time-ratio", versus="torch-sdpa-band", at_most=1 / 25, phase="fwd", n=16384,
                       note="at least 25x faster than dense SDPA with the band mask at n=16384 (window 128)"),
            zoo.Target("time-ratio", versus="flex-attention", at_most=1.0, phase="fwd", n=16384,
                       note="no slower than compiled FlexAttention with a sliding-window block mask at n=16384"),
            zoo.Target("peak-fraction", at_least=0.4, phase="fwd", n=16384,
                       note="at least 40% of the machine's measured matmul FLOP/s at n=16384"),
        ),
    ))
