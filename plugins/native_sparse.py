"""Native Sparse Attention (Yuan et al. 2025): each query attends through three branches, mixed by learned gates,

    o_t = g_t^cmp Attn(q_t, compressed blocks) + g_t^slc Attn(q_t, selected blocks) + g_t^win Attn(q_t, window),

each branch with keys and values of its own (one key/value head per branch, shared by every query head, as a
GQA group shares them in the paper), ``g = sigmoid(W_g x_t + b_g)`` per head and branch:

- **compression**: the keys of each complete block of ``block`` = l positions, concatenated, mapped to one key by
  a learned linear map (the same for values): ``kc_i = phi_k([k_(il); ...; k_(il+l-1)])``. Query t attends the
  blocks that end at or before t (none while t < l - 1: the branch gives zeros there).
- **selection**: the compression branch's logits, summed over the heads (one selection for the heads, as the
  paper's eq. 10 shares one in a group), rank the complete blocks before t's own; the top ``selected`` of them,
  plus t's own block up to t, are attended at full resolution.
- **window**: the keys 0 <= t - j <= ``window``.

Per query, the branches read n / l compressed keys, (``selected`` + 1) l selected keys and ``window`` + 1 window
keys: O(n (n / l + selected l + window)) time, the compression branch being the one quadratic term (divided by
l, as in the paper). Fast path: the compression branch as one fused SDPA under its (n, n / l) block mask, and
one matmul of the queries summed over the heads for the ranking; the selection branch gathers each query's blocks
(queries in chunks, so the gathered keys stay small) and runs fused SDPA with the query's heads as its rows (or,
where the selected blocks cover ``dense_fraction`` of the keys, one fused call over all keys under the selection as
a mask: short sequences); the window branch on blocks of ``window`` queries, the heads again rows
(``zoo.functional``). Decoding keeps every selection key and value (the selection may pick any block), the window's last keys, the compressed keys
and values, and the raw keys and values of the block not yet complete.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.decoding import append, push_window, refuse_key_mask, window_cache
from zoo.functional import check_dense_fraction, dense_call_pays, merge_heads, sliding_window_attention, split_heads
from zoo.reference import linear

GATHERED_ELEMENTS = 1 << 23  # the selection branch's gathered keys per chunk of queries (32 MiB in float32)
DENSE_FRACTION = 0.4  # per query, gathering its blocks costs more per score than one masked dense call: the layer
# took 26 / 76 ms (fwd / fwd+bwd) with the dense selection at n=512, where the selected keys are half the sequence,
# and 37 / 105 ms gathered; at n=1024 (a quarter) the two were even (d_model 512, 8 heads, 2-core CPU, the harness's
# allocator settings)
BRANCHES = ("cmp", "slc", "win")


class NativeSparseAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, block: int = 64, selected: int = 3, window: int = 64,
                 dense_fraction: float | None = DENSE_FRACTION):
        super().__init__()
        for label, value in (("block", block), ("selected", selected), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        check_dense_fraction(dense_fraction)
        self.d_model, self.num_heads = d_model, num_heads
        self.block, self.selected, self.window, self.dense_fraction = block, selected, window, dense_fraction
        head = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_cmp, self.v_cmp, self.k_slc, self.v_slc, self.k_win, self.v_win = (
            nn.Linear(d_model, head, bias=False) for _ in range(6))
        # no bias for the keys' compressor: it would add q . b to every compressed logit of a query alike
        self.phi_k, self.phi_v = nn.Linear(block * head, head, bias=False), nn.Linear(block * head, head)
        self.gate = nn.Linear(d_model, 3 * num_heads)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        for layer in (self.q_proj, self.k_cmp, self.v_cmp, self.k_slc, self.v_slc, self.k_win, self.v_win,
                      self.phi_k, self.phi_v, self.gate, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def project(self, query, key, value):
        """The per-head queries (batch, heads, n, d); each branch's keys and values (batch, n, d), as a dict
        ``{"k_cmp": ..., "v_cmp": ..., ...}``, with ``"rank_q"``, the queries summed over the heads (batch, n, d);
        the gates (3, batch, heads, n, 1), compression, selection, window. What ranks the blocks (the compression
        keys and the summed queries) is computed in float32 at least: in bfloat16 the ranking would otherwise
        choose other blocks than the exact one at near-ties a 1/256 rounding cannot tell apart. Layers that read
        the same input at the same precision run as one matmul of their stacked weights (all eight at once in
        float32 self-attention, where query, key and value are one tensor)."""
        low, wide = query.dtype, torch.promote_types(query.dtype, torch.float32)
        layers = {"q_proj": (query, low), "gate": (query, low), "k_cmp": (key, wide),
                  **{f"{kind}_{branch}": (key if kind == "k" else value, low)
                     for branch in BRANCHES for kind in "kv" if (kind, branch) != ("k", "cmp")}}
        outputs = {}
        if low != wide:  # sum_h q_h = query (sum_h W_h)^T, in float32 from the inputs
            summed = self.q_proj.weight.to(wide).view(self.num_heads, self.d_model // self.num_heads, -1).sum(0)
            outputs["rank_q"] = F.linear(query.to(wide), summed)
        groups = {}
        for name, (source, dtype) in layers.items():
            groups.setdefault((id(source), dtype), (source, dtype, []))[2].append(name)
        for source, dtype, names in groups.values():
            modules = [getattr(self, name) for name in names]
            weights = torch.cat([m.weight for m in modules]).to(dtype)
            bias = None if all(m.bias is None for m in modules) else torch.cat(
                [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules]).to(dtype)
            fused = F.linear(source.to(dtype), weights, bias).split([m.out_features for m in modules], -1)
            outputs.update(zip(names, fused))
        q = split_heads(outputs.pop("q_proj"), self.num_heads)
        if "rank_q" not in outputs:
            outputs["rank_q"] = q.detach().sum(1)
        gates = torch.sigmoid(outputs.pop("gate")).unflatten(-1, (3, self.num_heads)).permute(2, 0, 3, 1).unsqueeze(-1)
        return q, outputs, gates

    def compress(self, keys, values):
        """The compressed keys and values (batch, n // block, d) of the complete blocks, each at the precision of
        what it compresses (the keys in float32 at least)."""
        complete = keys.shape[1] // self.block * self.block
        return tuple(F.linear(x[:, :complete].unflatten(1, (-1, self.block)).flatten(2), phi.weight.to(x.dtype),
                              None if phi.bias is None else phi.bias.to(x.dtype))
                     for phi, x in ((self.phi_k, keys), (self.phi_v, values)))

    def forward(self, query, key, value, attn_mask=None, is_causal=True):
        return self.attend(*self.project(query, key, value))

    def attend(self, q, kv, gates):
        """The causal output from the projections: the three branches, gated, the heads merged and projected."""
        if q.shape[2] == 0:
            return self.out_proj(merge_heads(q * 0.0))
        compressed_k, compressed_v = self.compress(kv["k_cmp"], kv["v_cmp"])
        cmp, importance = compressed_attention(q, kv["rank_q"], compressed_k, compressed_v, self.block)
        slc = selected_attention(q, kv["k_slc"], kv["v_slc"], importance, self.block, self.selected,
                                 self.dense_fraction)
        win = sliding_window_attention(q, kv["k_win"].unsqueeze(1), kv["v_win"].unsqueeze(1), self.window)
        return self.out_proj(merge_heads(gates[0] * cmp + gates[1] * slc + gates[2] * win))


def compressed_attention(q, rank_q, keys, values, block):
    """Softmax of the (batch, heads, n, d) queries over the compressed blocks each may see (block i by query t when
    i block + block - 1 <= t; zeros while none is complete), and the blocks' importance for each query (batch, n,
    n // block): the logits summed over the heads, from ``rank_q`` (the queries summed over the heads) and the
    keys at their precision (float32 at least): sum_h q_h . k = (sum_h q_h) . k, one matmul, not one per head."""
    batch, heads, n, _ = q.shape
    first, blocks = block - 1, keys.shape[1]
    importance = q.new_full((batch, n, blocks), float("-inf"), dtype=keys.dtype)
    if blocks == 0:
        return q * 0.0, importance
    t = torch.arange(first, n, device=q.device)
    visible = torch.arange(blocks, device=q.device) < torch.div(t + 1, block, rounding_mode="floor").unsqueeze(1)
    with torch.no_grad():  # a ranking has no gradient
        importance[:, first:] = rank_q[:, first:].to(keys.dtype) @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    out = F.scaled_dot_product_attention(q[:, :, first:], *(x.to(q.dtype).unsqueeze(1).expand(-1, heads, -1, -1)
                                                             for x in (keys, values)), attn_mask=visible)
    return F.pad(out, (0, 0, first, 0)), importance


def selected_blocks(importance, n, block, selected):
    """For each query t (batch, n, s): the indices of the blocks it attends at full resolution (the ``selected``
    most important complete blocks before its own, then its own block) and which of them are real (a query with
    fewer candidates than ``selected`` has filler entries)."""
    batch = importance.shape[0]
    own = torch.div(torch.arange(n, device=importance.device), block, rounding_mode="floor")
    top = min(selected, max(0, n - 1) // block)  # the last query's candidates: no query has more
    candidate = torch.arange(importance.shape[-1], device=importance.device) < own.unsqueeze(1)
    ranked = importance.masked_fill(~candidate, float("-inf"))  # finite for every candidate
    values, indices = ranked.topk(top, dim=-1) if top else (ranked[..., :0], own.new_zeros(batch, n, 0))
    indices = torch.cat([indices, own.view(1, n, 1).expand(batch, n, 1)], dim=-1)
    real = torch.cat([values > float("-inf"), torch.ones_like(indices[..., :1], dtype=torch.bool)], dim=-1)
    return indices, real


def selected_attention(q, keys, values, importance, block, selected, dense_fraction=None):
    """Softmax of each query over the keys of its selected blocks and of its own block up to itself: the blocks
    gathered per query (a chunk of queries at a time), each query's heads as the rows of one fused SDPA call; or,
    where the selected keys reach ``dense_fraction`` of the sequence, one fused call over every key under the
    selection as a mask (:func:`masked_selection`)."""
    batch, heads, n, d = q.shape
    indices, real = selected_blocks(importance, n, block, selected)
    spans = indices.shape[-1] * block
    if dense_call_pays(n * spans, n * n, dense_fraction):
        return masked_selection(q, keys, values, indices, real, block)
    # whole blocks as rows, so gathering a block copies one contiguous row (index_select, not advanced indexing)
    key_rows, value_rows = (F.pad(x, (0, 0, 0, -n % block)).unflatten(1, (-1, block)).flatten(2).flatten(0, 1)
                            for x in (keys, values))
    rows = indices + torch.arange(batch, device=q.device).view(batch, 1, 1) * -(-n // block)
    offsets = torch.arange(block, device=q.device)
    queries = q.transpose(1, 2)  # (batch, n, heads, d)
    chunk = max(1, GATHERED_ELEMENTS // max(1, batch * spans * d))
    outputs = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        positions = indices[:, start:stop].unsqueeze(-1) * block + offsets  # (batch, chunk, s, block)
        t = torch.arange(start, stop, device=q.device).view(1, -1, 1, 1)
        allowed = (real[:, start:stop].unsqueeze(-1) & (positions <= t)).view(-1, 1, 1, spans)
        index = rows[:, start:stop].flatten()
        k, v = (x.index_select(0, index).view(-1, 1, spans, d) for x in (key_rows, value_rows))
        out = F.scaled_dot_product_attention(queries[:, start:stop].flatten(0, 1).unsqueeze(1), k, v,
                                             attn_mask=allowed)
        outputs.append(out.view(batch, stop - start, heads, d))
    return torch.cat(outputs, dim=1).transpose(1, 2)


def masked_selection(q, keys, values, indices, real, block):
    """The selection branch as one fused SDPA call over all n keys (one key/value head for every query head) under
    the (batch, n, n) mask of each query's selected blocks, up to the query."""
    n = q.shape[2]
    chosen = torch.zeros(q.shape[0], n, -(-n // block), dtype=torch.bool, device=q.device)
    chosen.scatter_(2, indices, real)
    earlier = torch.arange(n, device=q.device).view(1, n) <= torch.arange(n, device=q.device).view(n, 1)
    selection = chosen.repeat_interleave(block, dim=2)[:, :, :n] & earlier
    return F.scaled_dot_product_attention(q, keys.unsqueeze(1), values.unsqueeze(1), attn_mask=selection.unsqueeze(1),
                                          enable_gqa=True)


def reference(module, query, key, value, attn_mask=None, is_causal=True):
    """The paper's three branches in float64, each query's masks written out: the compressed blocks each query
    may see, the selected ones ranked by the compression logits summed over the heads (a sort), and the window;
    each a plain softmax over an (n, n) or (n, blocks) boolean mask, gated and summed."""
    h, n, l = module.num_heads, query.shape[1], module.block
    d = module.d_model // h
    q = linear(query, module.q_proj).unflatten(-1, (h, d)).transpose(1, 2)  # (batch, h, n, d)
    k = {name: linear(key if name[0] == "k" else value, getattr(module, name))
         for name in ("k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win")}
    gates = torch.sigmoid(linear(query, module.gate)).unflatten(-1, (3, h)).permute(2, 0, 3, 1).unsqueeze(-1)
    blocks = n // l
    kc = linear(k["k_cmp"][:, :blocks * l].reshape(query.shape[0], blocks, l * d), module.phi_k).unsqueeze(1)
    vc = linear(k["v_cmp"][:, :blocks * l].reshape(query.shape[0], blocks, l * d), module.phi_v).unsqueeze(1)
    i = torch.arange(n).view(n, 1)

    def softmax_over(keys, vals, mask):  # rows with no allowed key give zeros
        scores = (q @ keys.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        return weights @ vals, weights

    visible = (torch.arange(blocks).view(1, blocks) + 1) * l - 1 <= i
    cmp, _ = softmax_over(kc, vc, visible)
    importance = (q @ kc.transpose(-1, -2)).sum(1)  # (batch, n, blocks), the scale left out: the order is the same
    chosen = torch.zeros(query.shape[0], n, blocks, dtype=torch.bool)
    for t in range(n):
        candidates = [b for b in range(blocks) if b < t // l]
        for row in range(query.shape[0]):
            ranked = sorted(candidates, key=lambda b: -float(importance[row, t, b]))
            chosen[row, t, ranked[:module.selected]] = True
    j = torch.arange(n).view(1, n)
    block_of = torch.div(j, l, rounding_mode="floor")
    in_chosen = torch.gather(chosen, 2, block_of.clamp_max(max(blocks - 1, 0)).expand(query.shape[0], n, n)) \
        if blocks else torch.zeros(query.shape[0], n, n, dtype=torch.bool)
    in_chosen &= block_of < blocks
    selection = ((in_chosen | (block_of == i // l)) & (j <= i)).unsqueeze(1)
    slc, _ = softmax_over(k["k_slc"].unsqueeze(1), k["v_slc"].unsqueeze(1), selection)
    win, _ = softmax_over(k["k_win"].unsqueeze(1), k["v_win"].unsqueeze(1), (i - j >= 0) & (i - j <= module.window))
    mixed = gates[0] * cmp + gates[1] * slc + gates[2] * win
    return linear(mixed.transpose(1, 2).flatten(2), module.out_proj)


def prefill(module, query, key, value, key_mask=None):
    """The forward over the prompt, and the state: every selection key and value, the window's last ``window``
    keys and values (a ring: position t in slot t % window), the compressed keys and values of the complete
    blocks, and the raw compression keys and values of the incomplete one."""
    refuse_key_mask("native-sparse", key_mask)
    q, kv, gates = module.project(query, key, value)
    output = module.attend(q, kv, gates)
    n = query.shape[1]
    complete = n // module.block * module.block
    compressed_k, compressed_v = module.compress(kv["k_cmp"], kv["v_cmp"])
    state = {"k_slc": append(None, kv["k_slc"], 1), "v_slc": append(None, kv["v_slc"], 1),
             "k_cmp": append(None, compressed_k, 1), "v_cmp": append(None, compressed_v, 1),
             "k_pending": append(None, kv["k_cmp"][:, complete:], 1),
             "v_pending": append(None, kv["v_cmp"][:, complete:], 1),
             "position": n}
    for name in ("k_win", "v_win"):
        state[name] = window_cache(kv[name], module.window, 1)
    return output, state


def step(module, state, query, key, value, key_mask=None):
    """The next token t: its raw compression key joins the incomplete block (compressed once the block is
    complete); it attends the compressed blocks, the selected blocks and its own block so far, and the window;
    its keys then enter the caches."""
    refuse_key_mask("native-sparse", key_mask)
    q, kv, gates = module.project(query, key, value)
    state, t, l = dict(state), state["position"], module.block
    state["k_pending"], state["v_pending"] = (append(state[name], kv[source], 1)
                                              for name, source in (("k_pending", "k_cmp"), ("v_pending", "v_cmp")))
    if state["k_pending"].shape[1] == l:
        compressed_k, compressed_v = module.compress(state["k_pending"], state["v_pending"])
        state["k_cmp"], state["v_cmp"] = append(state["k_cmp"], compressed_k, 1), append(state["v_cmp"], compressed_v, 1)
        # emptied in place: the next block's keys go into the same buffer
        state["k_pending"], state["v_pending"] = (x[:, :0] for x in (state["k_pending"], state["v_pending"]))
    state["k_slc"], state["v_slc"] = append(state["k_slc"], kv["k_slc"], 1), append(state["v_slc"], kv["v_slc"], 1)
    blocks = state["k_cmp"].shape[1]
    if blocks:  # the compressed keys kept in float32 at least, for the ranking
        compressed_k = state["k_cmp"]
        cmp = F.scaled_dot_product_attention(q, compressed_k.to(q.dtype).unsqueeze(1), state["v_cmp"].unsqueeze(1),
                                             enable_gqa=True)
        own = t // l
        importance = kv["rank_q"].to(compressed_k.dtype) @ compressed_k[:, :own].transpose(-1, -2)
        chosen = importance[:, 0].topk(min(module.selected, own), dim=-1).indices  # (batch, top)
    else:
        cmp = q * 0.0
        own, chosen = t // l, q.new_zeros(q.shape[0], 0, dtype=torch.long)
    positions = torch.cat([(chosen.unsqueeze(-1) * l + torch.arange(l, device=q.device)).flatten(1),
                           torch.arange(own * l, t + 1, device=q.device).expand(q.shape[0], -1)], dim=1)
    rows = torch.arange(q.shape[0], device=q.device).unsqueeze(1)
    k, v = (state[name][rows, positions].unsqueeze(1) for name in ("k_slc", "v_slc"))
    slc = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    win = F.scaled_dot_product_attention(q, torch.cat([state["k_win"], kv["k_win"]], 1).unsqueeze(1),
                                         torch.cat([state["v_win"], kv["v_win"]], 1).unsqueeze(1), enable_gqa=True)
    for name in ("k_win", "v_win"):
        state[name] = push_window(state[name], kv[name], t, module.window, 1)
    state["position"] = t + 1
    return module.out_proj(merge_heads(gates[0] * cmp + gates[1] * slc + gates[2] * win)), state


def state_bytes(batch, context, d_model, num_heads, itemsize, block=64, selected=3, window=64, **options):
    """Keys and values of one head per branch: every token's selection pair, the window's last pairs, a
    compressed pair per complete block and the raw pairs of the incomplete block (its keys, which rank the
    blocks, in float32 at least)."""
    pairs = 2 * itemsize * (context + min(context, window))
    compression = (itemsize + max(itemsize, 4)) * (context // block + context % block)
    return batch * (d_model // num_heads) * (pairs + compression)


def dense_masks(module):
    """A baseline: the same selection, each branch as fused SDPA over all n keys with a dense (n, n) mask (the
    compressed branch as in the fast path)."""

    def run(query, key, value, attn_mask=None, is_causal=True):
        q, kv, gates = module.project(query, key, value)
        n, l = q.shape[2], module.block
        compressed_k, compressed_v = module.compress(kv["k_cmp"], kv["v_cmp"])
        cmp, importance = compressed_attention(q, kv["rank_q"], compressed_k, compressed_v, l)
        indices, real = selected_blocks(importance, n, l, module.selected)
        slc = masked_selection(q, kv["k_slc"], kv["v_slc"], indices, real, l)
        i = torch.arange(n, device=q.device).view(n, 1)
        j = torch.arange(n, device=q.device).view(1, n)
        band = (i - j >= 0) & (i - j <= module.window)
        win = F.scaled_dot_product_attention(q, kv["k_win"].unsqueeze(1), kv["v_win"].unsqueeze(1), attn_mask=band,
                                             enable_gqa=True)
        return module.out_proj(merge_heads(gates[0] * cmp + gates[1] * slc + gates[2] * win))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, block=64, selected=3, window=64, dense_fraction=DENSE_FRACTION,
          **options):
    """The projections (queries and output d_model wide, six one-head keys and values, the gates, the two block
    compressors); the compression branch's SDPA on (n - block + 1, n // block) scores and the one matmul that ranks
    the blocks (the queries summed over the heads first); the selection branch's SDPA, each query's heads against
    (min(selected, (n - 1) // block) + 1) blocks (against all n keys where it takes the masked call); the window
    branch's SDPA,
    each block of ``window`` queries against 2 ``window`` keys."""
    head = d_model // num_heads
    blocks = q_len // block
    projections = 2.0 * batch * q_len * d_model * (2 * d_model + 6 * head + 3 * num_heads)
    compressors = 2 * 2.0 * batch * blocks * block * head * head
    compression = (4.0 * num_heads + 2.0) * batch * max(0, q_len - block + 1) * blocks * head if blocks else 0.0
    spans = (min(selected, max(0, q_len - 1) // block) + 1) * block
    if dense_call_pays(q_len * spans, q_len * q_len, dense_fraction):
        spans = q_len  # every key, under the selection as a mask
    selection = 4.0 * batch * q_len * num_heads * spans * head
    windows = 4.0 * batch * num_heads * -(-q_len // window) * window * 2 * window * head
    return projections + compressors + compression + selection + windows


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="native-sparse",
        summary="Native Sparse Attention: compressed blocks, the top blocks they rank and a sliding window, mixed "
                "by learned gates; causal, O(n^2 / block) for the compression and O(n) for the rest.",
        family="sparse",
        citation="Yuan, Gao, Dai, Luo, Zhao, Zhang, Xie, Wei, Wang, Xiao, Wang, Ruan, Zhang, Liang & Zeng 2025, "
                 "Native Sparse Attention: Hardware-Aligned and Natively Trainable Sparse Attention (ACL)",
        departures=(
            zoo.Departure("substitution", "the block compressor is one learned linear map of the block's "
                                          "concatenated keys (values), which sees each position of the block "
                                          "apart; the paper uses an MLP with an intra-block position encoding (a "
                                          "linear map turns that encoding into a bias, which the keys' compressor "
                                          "drops: softmax ignores a shift every compressed logit shares)"),
            zoo.Departure("substitution", "compression blocks do not overlap and are the selection blocks (the "
                                          "paper: compression blocks of 32 at stride 16, selection blocks of 64 "
                                          "scored through its eq. 9)"),
            zoo.Departure("substitution", "blocks are ranked by the compression logits summed over the heads (the "
                                          "product of the heads' probabilities, up to a constant per query) where "
                                          "the paper's eq. 10 sums the probabilities: the same ranking with one "
                                          "head; the paper's sum ties within float32's rounding once two heads' "
                                          "softmaxes saturate on different blocks (each near 1), and its top-n then "
                                          "differs between precisions"),
            zoo.Departure("substitution", "the query's own block is always selected (up to the query) and the top "
                                          "`selected` complete blocks before it by importance; the paper fixes "
                                          "the first block and two local blocks among its 16"),
            zoo.Departure("convention", "one key/value head per branch shared by all query heads (one GQA group "
                                        "sharing one selection); gates sigmoid of a linear map of the query input; "
                                        "projections Xavier-uniform, biases (values' compressor, gates) starting at 0"),
        ),
        factory=NativeSparseAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, causal_only=True, accepts_attn_mask=False, allows_different_lengths=False,
                      key_order_invariant=False),
        complexity=zoo.Complexity(time=1, memory=1),
        options={"block": 64, "selected": 3, "window": 64, "dense_fraction": DENSE_FRACTION},
        # the small shapes check the gathered selection; the masked one is checked at the defaults (long sequences)
        check_options={"block": 2, "selected": 1, "window": 2, "dense_fraction": None},
        quality_options={"block": 8, "selected": 2, "window": 8},
        baselines={"dense-masks": dense_masks},
        best_known="dense-masks",
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="token", state_bytes=state_bytes),
        targets=(
            zoo.Target("time-ratio", versus="torch-sdpa", at_most=1 / 3, mode="causal", phase="fwd", n=16384,
                       note="at least 3x faster than causal torch SDPA at n=16384"),
        ),
    ))
