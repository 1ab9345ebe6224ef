"""Block-sparse attention in the BigBird pattern (Zaheer et al. 2020): the sequence is cut into blocks of
``block`` tokens, and each query block attends to

- its ``window`` neighbouring blocks on each side (only earlier ones when causal) and itself,
- the first ``global_blocks`` blocks, whose own queries attend to every key (global tokens),
- ``random_blocks`` further blocks drawn once per sequence length from a generator seeded by ``seed``
  (only earlier ones when causal).

Keys are gathered per query block, so time and memory are O(n * block * (2 window + 1 + global + random)):
no n x n mask or score matrix, except the global queries' own rows, O(global * block * n). A sequence short
enough that the gathered blocks would hold at least ``dense_fraction`` of the n x n scores anyway (every
block reads nearly every other: n up to about 8 blocks with the defaults) takes one fused SDPA call with the
pattern as a dense mask instead, cheaper there than the gathers. Decoding caches
every key (a later block may draw any earlier one) and reads, per step, only the keys its query's block reads.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import append
from zoo.functional import (DENSE_FRACTION, check_dense_fraction, dense_call_pays, gathered_mask, masked_sdpa,
                            merge_heads, pattern_sdpa, sdpa_zeroing_empty_rows, split_heads)
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
                 random_blocks: int = 2, seed: int = 0, dense_fraction: float | None = DENSE_FRACTION):
        super().__init__()
        for label, value, least in (("block", block, 1), ("window", window, 0), ("global_blocks", global_blocks, 0),
                                    ("random_blocks", random_blocks, 0), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{label} must be an integer >= {least}, got {value!r}")
        self.d_model, self.num_heads, self.block = d_model, num_heads, block
        self.window, self.global_blocks, self.random_blocks, self.seed = window, global_blocks, random_blocks, seed
        check_dense_fraction(dense_fraction)
        self.dense_fraction = dense_fraction

    def key_blocks(self, blocks: int, causal: bool) -> list[list[int]]:
        """Every query block's key blocks (window, globals, random draws), without repeats."""
        drawn = random_layout(blocks, self.window, self.global_blocks, self.random_blocks, self.seed, causal)
        return [self.row(i, blocks, causal, drawn[i]) for i in range(blocks)]

    def row(self, i: int, blocks: int, causal: bool, drawn: tuple) -> list[int]:
        """Query block ``i``'s key blocks, given its random draws."""
        if i < self.global_blocks:
            return list(range(i + 1 if causal else blocks))
        near = range(max(0, i - self.window), min(blocks, i + (0 if causal else self.window) + 1))
        return sorted(set(near) | set(range(min(self.global_blocks, blocks))) | set(drawn))

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        if query.shape[1] == 0:
            return value * 0.0  # an empty sequence: no blocks, and an output still in the graph
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        batch, heads, n, width = q.shape
        block = self.block
        blocks = -(-n // block)
        global_rows = min(self.global_blocks, blocks)
        local_rows = self.key_blocks(blocks, is_causal)[global_rows:]
        slots = max(map(len, local_rows), default=0)
        scores = gathered_scores(n, block, global_rows, slots)
        if dense_call_pays(scores, n * n, self.dense_fraction):
            return merge_heads(pattern_sdpa(q, k, v, layout_mask(self, n, is_causal, q.device), attn_mask))
        pad = blocks * block - n
        if pad:
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        device = q.device
        out = []
        if global_rows:  # global queries attend to every key: one dense call over their rows
            rows = min(global_rows * block, n)
            mask = None if attn_mask is None else _rows(attn_mask, rows, n)
            dense = masked_sdpa(q[:, :, :rows], k[:, :, :n], v[:, :, :n], mask, is_causal)
            out.append(F.pad(dense, (0, 0, 0, global_rows * block - rows)))
        if local_rows:
            index = torch.tensor([row + [row[0]] * (slots - len(row)) for row in local_rows], device=device)
            used = torch.tensor([[s < len(row) for s in range(slots)] for row in local_rows], device=device)
            k_blocks, v_blocks = (x.reshape(batch * heads, blocks, block, width) for x in (k, v))
            # index_select writes the gathered blocks contiguously; x[:, index] laid them out index-first and the
            # reshape then copied them all again (the two took half of a forward at n=8192)
            k_gathered, v_gathered = (x.index_select(1, index.flatten()).view(batch * heads, len(local_rows),
                                                                              slots * block, width)
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


def gathered_scores(n: int, block: int, global_rows: int, slots: int) -> int:
    """Scores the blocked path computes: the global queries' rows against every key, each other query block
    against ``slots`` gathered key blocks."""
    blocks = -(-n // block)
    return min(global_rows * block, n) * n + (blocks - global_rows) * block * slots * block


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


def prefill(module, query, key, value, key_mask=None):
    """The prompt through the causal forward; every key and value cached, since a later block may draw any
    earlier block past the globals at random."""
    h, p = module.num_heads, query.shape[1]
    output = (module(query, key, value, attn_mask=None if key_mask is None else key_mask[:, None, None, :],
                     is_causal=True) if p else query.new_zeros(*query.shape[:2], value.shape[-1]))
    state = {"position": p, "k": append(None, split_heads(key, h), 2), "v": append(None, split_heads(value, h), 2)}
    if key_mask is not None:
        state["key_mask"] = append(None, key_mask.to(torch.bool), 1)
    return output, state


def step(module, state, query, key, value, key_mask=None):
    """The next query over the keys its block reads in the causal forward, read in place from the cache: a few
    contiguous runs, their scores under one softmax. O(keys read), not O(context), and no key is copied (a
    gather of them cost more than the attention over them)."""
    h, position = module.num_heads, state["position"]
    q, k, v = (split_heads(x, h) for x in (query, key, value))
    state = dict(state, position=position + 1)
    state["k"], state["v"] = append(state["k"], k, 2), append(state["v"], v, 2)
    keys, values, runs = state["k"], state["v"], _read_runs(module, position)
    scores = torch.cat([q @ keys[:, :, i:j].transpose(-1, -2) for i, j in runs], dim=-1) * q.shape[-1] ** -0.5
    allowed = None
    if key_mask is not None or "key_mask" in state:
        ones = functools.partial(torch.ones, q.shape[0], dtype=torch.bool, device=q.device)
        kept = state["key_mask"] if "key_mask" in state else ones(position)
        state["key_mask"] = append(kept, ones(1) if key_mask is None else key_mask.to(torch.bool), 1)
        allowed = torch.cat([state["key_mask"][:, i:j] for i, j in runs], dim=1)[:, None, None, :]
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(dim=-1).split([j - i for i, j in runs], dim=-1)
    out = sum(w @ values[:, :, i:j] for w, (i, j) in zip(weights, runs))
    if allowed is not None:  # a query with no key to attend to: zeros, as the forward gives
        out = out.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    return merge_heads(out), state


def _read_runs(module, position: int) -> list[list[int]]:
    """The key positions the query at ``position`` reads, as [start, stop) runs: its block's key blocks, adjacent
    ones merged, the last (its own) cut after it. The random draws come from the layout of the next power of two
    blocks: a causal draw does not depend on the length, so one layout serves every block below it and only a few
    are ever built."""
    block, current = module.block, position // module.block
    drawn = random_layout(1 << current.bit_length(), module.window, module.global_blocks, module.random_blocks,
                          module.seed, True)[current]
    runs = []
    for j in module.row(current, current + 1, True, drawn):
        if runs and runs[-1][1] == j * block:
            runs[-1][1] += block
        else:
            runs.append([j * block, (j + 1) * block])
    runs[-1][1] = position + 1
    return runs


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize  # every key and value


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
          dense_fraction=DENSE_FRACTION, **options):
    """Without is_causal: the global queries against every key, and every other query block against its
    key blocks (each row padded to the widest: 2 window + 1 + global + random blocks, or all of them); or
    every query against every key where the forward takes the dense call."""
    blocks = -(-q_len // block)
    global_rows = min(global_blocks, blocks)
    slots = min(blocks, 2 * window + 1 + global_blocks + random_blocks) if blocks > global_rows else 0
    scores = gathered_scores(q_len, block, global_rows, slots)
    if dense_call_pays(scores, q_len * k_len, dense_fraction):
        scores = q_len * k_len
    return 4.0 * batch * scores * d_model


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="block-sparse",
        summary="BigBird block-sparse attention: neighbouring, global and random key blocks, gathered per query block.",
        family="sparse",
        citation="Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences",
        departures=(
            zoo.Departure("substitution",
                          "only the first global_blocks blocks are global; BigBird-ITC makes the first and the last block global"),
            zoo.Departure("substitution",
                          "random blocks drawn once per module from a seed, the same for every head and sequence; BigBird draws per head"),
            zoo.Departure("convention",
                          "window counts blocks on each side (window=1: 3 blocks); BigBird's w is the total width"),
            zoo.Departure("substitution", "defaults of 1 global and 2 random blocks; BigBird-ITC base uses 2 and 3"),
            zoo.Departure("omission", "no BigBird-ETC (extra global tokens added to the sequence)"),
            zoo.Departure("extension",
                          "a causal mode (the window and random blocks from earlier blocks only) and decoding; BigBird's is bidirectional"),
        ),
        factory=BlockSparseAttention,
        reference=reference,
        tags=zoo.Tags(allows_different_lengths=False, key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"block": 64, "window": 1, "global_blocks": 1, "random_blocks": 2, "seed": 0,
                 "dense_fraction": DENSE_FRACTION},
        # the small shapes check the gathered path; its dense path is checked at the defaults (long sequences)
        check_options={"block": 2, "window": 1, "global_blocks": 1, "random_blocks": 1, "dense_fraction": None},
        quality_options={"block": 8},  # 6 blocks of 64 cover every quality task: dense there
        baselines={"dense-sdpa-layout": dense_layout_sdpa},
        best_known="dense-sdpa-layout",
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="token", state_bytes=cache_bytes),
        targets=(
            zoo.Target("time-ratio", versus="dense-sdpa-layout", at_most=1 / 10, phase="fwd", n=8192,
                       note="at least 10x faster than dense SDPA with the same pattern as a mask at n=8192"),
        ),
    ))
