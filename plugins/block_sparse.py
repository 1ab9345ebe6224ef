"""Block-sparse attention in the BigBird pattern (Zaheer et al. 2020): the sequence is cut into blocks of
``block`` tokens, and each query block attends to

- its ``window`` neighbouring blocks on each side (only earlier ones when causal) and itself,
- the first ``global_blocks`` blocks, whose own queries attend to every key (global tokens),
- ``random_blocks`` further blocks drawn once per sequence length from a generator seeded by ``seed``
  (only earlier ones when causal).

Keys are gathered per query block, so time and memory are O(n * block * (2 window + 1 + global + random)):
no n x n mask or score matrix, except the global queries' own rows, O(global * block * n).
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import gathered_mask, masked_sdpa, merge_heads, sdpa_zeroing_empty_rows, split_heads
from zoo.reference import reference_mask, softmax_attention


@functools.lru_cache(maxsize=64)
def random_layout(blocks: int, window: int, global_blocks: int, random_blocks: int, seed: int, causal: bool):
    """For each query block, the random key blocks it reads: drawn without repeats from the blocks that
    neither its window nor the global blocks cover (earlier ones only when causal). A tuple per block."""
    generator = torch.Generator().manual_seed(seed)
    layout = []
    for i in range(blocks):
        if i < global_blocks:
            layout.append(())
            continue
        candidates = [j for j in range(global_blocks, blocks)
                      if abs(i - j) > window and (j < i or not causal)]
        order = torch.randperm(len(candidates), generator=generator)[:random_blocks].tolist()
        layout.append(tuple(sorted(candidates[o] for o in order)))
    return tuple(layout)


class BlockSparseAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, block: int = 64, window: int = 1, global_blocks: int = 1,
                 random_blocks: int = 2, seed: int = 0):
        super().__init__()
        for label, value, least in (("block", block, 1), ("window", window, 0), ("global_blocks", global_blocks, 0),
                                    ("random_blocks", random_blocks, 0), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{label} must be an integer >= {least}, got {value!r}")
        self.d_model, self.num_heads, self.block = d_model, num_heads, block
        self.window, self.global_blocks, self.random_blocks, self.seed = window, global_blocks, random_blocks, seed

    def key_blocks(self, blocks: int, causal: bool) -> list[list[int]]:
        """Every query block's key blocks (window, globals, random draws), without repeats."""
        drawn = random_layout(blocks, self.window, self.global_blocks, self.random_blocks, self.seed, causal)
        rows = []
        for i in range(blocks):
            if i < self.global_blocks:
                rows.append(list(range(i + 1 if causal else blocks)))
                continue
            near = range(max(0, i - self.window), min(blocks, i + (0 if causal else self.window) + 1))
            rows.append(sorted(set(near) | set(range(min(self.global_blocks, blocks))) | set(drawn[i])))
        return rows

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        batch, heads, n, width = q.shape
        block = self.block
        blocks = -(-n // block)
        pad = blocks * block - n
        if pad:
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        device = q.device
        global_rows = min(self.global_blocks, blocks)
        local_rows = self.key_blocks(blocks, is_causal)[global_rows:]
        out = []
        if global_rows:  # global queries attend to every key: one dense call over their rows
            rows = min(global_rows * block, n)
            mask = None if attn_mask is None else _rows(attn_mask, rows, n)
            dense = masked_sdpa(q[:, :, :rows], k[:, :, :n], v[:, :, :n], mask, is_causal)
            out.append(F.pad(dense, (0, 0, 0, global_rows * block - rows)))
        if local_rows:
            slots = max(len(row) for row in local_rows)
            index = torch.tensor([row + [row[0]] * (slots - len(row)) for row in local_rows], device=device)
            used = torch.tensor([[s < len(row) for s in range(slots)] for row in local_rows], device=device)
            k_blocks, v_blocks = (x.reshape(batch * heads, blocks, block, width) for x in (k, v))
            k_gathered, v_gathered = (x[:, index].reshape(batch * heads, len(local_rows), slots * block, width)
                                      for x in (k_blocks, v_blocks))
            query_pos = (torch.arange(global_rows, blocks, device=device).view(-1, 1, 1) * block
                         + torch.arange(block, device=device).view(1, block, 1))  # (rows, block, 1)
            key_pos = (index.unsqueeze(-1) * block + torch.arange(block, device=device)).view(len(local_rows), 1, -1)
            mask = used.repeat_interleave(block, dim=1).unsqueeze(1) & (key_pos < n)  # (rows, 1, slots * block)
            if is_causal:
                mask = mask & (key_pos <= query_pos)
            if attn_mask is not None:
                mask = mask & gathered_mask(attn_mask, query_pos, key_pos, batch, heads, n, n)
            q_local = q[:, :, global_rows * block:].reshape(batch * heads, len(local_rows), block, width)
            local = sdpa_zeroing_empty_rows(q_local, k_gathered, v_gathered, mask)  # mask: (rows, 1 or block, slots * block)
            out.append(local.view(batch, heads, len(local_rows) * block, width))
        return merge_heads(torch.cat(out, dim=2)[:, :, :n])


def _rows(attn_mask, rows: int, n: int):
    """The first ``rows`` query rows of the user's mask (broadcast to n x n first)."""
    if attn_mask.dim() == 1:
        attn_mask = attn_mask.view(1, -1)
    return attn_mask.expand(*attn_mask.shape[:-2], n, n)[..., :rows, :]


def layout_mask(module, n: int, is_causal: bool, device=None):
    """The dense (n, n) pattern this variant computes sparsely, rebuilt from its rules block by block (the
    random draws are the module's); cached per shape, so a timed baseline call does not rebuild it."""
    return _dense_pattern(n, module.block, module.window, module.global_blocks, module.random_blocks, module.seed,
                          is_causal).to(device)


@functools.lru_cache(maxsize=8)
def _dense_pattern(n, block, window, global_blocks, random_blocks, seed, is_causal):
    blocks = -(-n // block)
    drawn = random_layout(blocks, window, global_blocks, random_blocks, seed, is_causal)
    allowed = torch.zeros(blocks, blocks, dtype=torch.bool)
    for i in range(blocks):
        for j in range(blocks):
            is_global = i < global_blocks or j < global_blocks
            near = -window <= j - i <= (0 if is_causal else window)
            allowed[i, j] = is_global or near or j in drawn[i]
    token_block = torch.arange(n) // block
    mask = allowed[token_block.view(-1, 1), token_block.view(1, -1)]
    if is_causal:
        mask = mask & (torch.arange(n).view(1, -1) <= torch.arange(n).view(-1, 1))
    return mask


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    h, n = module.num_heads, query.shape[1]
    mask = layout_mask(module, n, is_causal)
    mask = reference_mask(mask if attn_mask is None else mask & attn_mask, False, n, n)
    heads = [x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value)]
    return softmax_attention(*heads, mask).transpose(1, 2).flatten(2)


def dense_layout_sdpa(module):
    """A baseline: torch's SDPA over the whole sequence with the same pattern as a dense mask."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        mask = layout_mask(module, query.shape[1], is_causal, query.device)
        if attn_mask is not None:
            mask = mask & attn_mask
        q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
        return merge_heads(masked_sdpa(q, k, v, mask))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, block=64, window=1, global_blocks=1, random_blocks=2, seed=0,
          **options):
    """Without is_causal: the global queries against every key, and every other query block against its
    key blocks (each row padded to the widest: 2 window + 1 + global + random blocks, or all of them)."""
    blocks = -(-q_len // block)
    global_rows = min(global_blocks, blocks)
    slots = min(blocks, 2 * window + 1 + global_blocks + random_blocks)
    dense = 4.0 * batch * min(global_rows * block, q_len) * k_len * d_model
    return dense + 4.0 * batch * (blocks - global_rows) * block * slots * block * d_model


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="block-sparse",
        summary="BigBird block-sparse attention: neighbouring, global and random key blocks, gathered per query block.",
        family="sparse",
        citation="Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences",
        factory=BlockSparseAttention,
        reference=reference,
        tags=zoo.Tags(allows_different_lengths=False, key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"block": 64, "window": 1, "global_blocks": 1, "random_blocks": 2, "seed": 0},
        check_options={"block": 2, "window": 1, "global_blocks": 1, "random_blocks": 1},
        baselines={"dense-sdpa-layout": dense_layout_sdpa},
        flops=flops,
        targets=(
            zoo.Target("time-ratio", versus="dense-sdpa-layout", at_most=1 / 10, phase="fwd", n=8192,
                       note="at least 10x faster than dense SDPA with the same pattern as a mask at n=8192"),
        ),
    ))
