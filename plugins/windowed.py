"""Sliding-window (local) attention: each query sees the keys within ``window`` positions.

Computed on blocks: the queries are cut into blocks of ``block``, and each block attends, in one
batched SDPA call, to its own keys plus ``window`` on either side (only earlier ones when causal),
with a (blocks, block, span) mask. Time and memory are O(n * window): no n x n mask or score matrix.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import gathered_mask, merge_heads, split_heads
from zoo.reference import reference_mask, softmax_attention


class WindowedAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, window: int = 128, block: int = 64):
        super().__init__()
        for label, value in (("window", window), ("block", block)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        self.d_model, self.num_heads, self.window, self.block = d_model, num_heads, window, block

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        batch, heads, n, width = q.shape
        block, left = self.block, self.window
        right = 0 if is_causal else self.window
        span = block + left + right
        blocks = -(-n // block)
        pad = blocks * block - n

        q_blocks = F.pad(q, (0, 0, 0, pad)).reshape(batch * heads, blocks, block, width)
        k_windows, v_windows = (
            F.pad(x, (0, 0, left, pad + right)).unfold(2, span, block).transpose(-1, -2)
            .reshape(batch * heads, blocks, span, width)
            for x in (k, v)
        )

        # Query i = b * block + r meets key j = b * block - left + c: allowed when j - i lies in
        # [-window, right] and j is a real key.
        device = q.device
        r = torch.arange(block, device=device).view(block, 1)
        c = torch.arange(span, device=device).view(1, span)
        band = ((c - r - left) >= -self.window) & ((c - r - left) <= right)
        key_pos = torch.arange(blocks, device=device).view(blocks, 1) * block - left + c
        # Blocks whose keys all exist (first key b * block - left >= 0, last b * block + block + right - 1 < n)
        # share one (block, span) band, a 2-D mask torch's fused kernel takes; the edges and a user's mask
        # need a mask per block. Worked out from the sizes: no value is read back from the device.
        first = min(blocks, -(-left // block))
        last = max(first, min(blocks, (n - block - right) // block + 1)) if attn_mask is None and n >= block + right else first
        parts = []
        if first > 0:
            parts.append(self._masked(q_blocks[:, :first], k_windows[:, :first], v_windows[:, :first], band,
                                      key_pos[:first], 0, attn_mask, batch, heads, n))
        if last > first:
            parts.append(F.scaled_dot_product_attention(q_blocks[:, first:last], k_windows[:, first:last],
                                                        v_windows[:, first:last], attn_mask=band))
        if last < blocks:
            parts.append(self._masked(q_blocks[:, last:], k_windows[:, last:], v_windows[:, last:], band,
                                      key_pos[last:], last, attn_mask, batch, heads, n))
        out = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        return merge_heads(out.view(batch, heads, blocks * block, width)[:, :, :n])

    def _masked(self, q_blocks, k_windows, v_windows, band, key_pos, start, attn_mask, batch, heads, n):
        """Blocks at the edges (keys before 0 or past n) or under a user mask: a mask per block, expanded to
        4-D so torch's fused kernel still applies; rows with no allowed key give zeros."""
        blocks, block = key_pos.shape[0], self.block
        mask = band & ((key_pos >= 0) & (key_pos < n)).unsqueeze(1)  # (blocks, block, span)
        if attn_mask is not None:
            query_pos = torch.arange(start * block, (start + blocks) * block, device=key_pos.device).view(blocks, block, 1)
            mask = mask & gathered_mask(attn_mask, query_pos, key_pos.unsqueeze(1), batch, heads, n, n)
        mask = mask.expand(q_blocks.shape[0], *mask.shape[-3:])
        row_ok = mask.any(dim=-1, keepdim=True)
        out = F.scaled_dot_product_attention(q_blocks, k_windows, v_windows, attn_mask=mask | ~row_ok)
        return out.masked_fill(~row_ok, 0.0)


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
        factory=WindowedAttention,
        reference=reference,
        tags=zoo.Tags(allows_different_lengths=False, key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"window": 128, "block": 64},
        check_options={"window": 3, "block": 4},
        baselines={"torch-sdpa-band": dense_band_sdpa},
        peers={"flex-attention": flex_sliding_window},
        targets=(
            zoo.Target("x-torch-sdpa-band", 1 / 25, phase="fwd", n=16384,
                       note="at least 25x faster than dense SDPA with the band mask at n=16384 (window 128)"),
            zoo.Target("x-flex-attention", 1.0, phase="fwd", n=16384,
                       note="no slower than compiled FlexAttention with a sliding-window block mask at n=16384"),
        ),
    ))
