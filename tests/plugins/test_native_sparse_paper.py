"""An independent check of the "native-sparse" variant (Native Sparse Attention, Yuan et al. 2025: "Native Sparse
Attention: Hardware-Aligned and Natively Trainable Sparse Attention"), written from the paper's equations and the
calling contract only, not from the fast path.

One layer, causal self-attention, three branches mixed by gates. H query heads of d = d_model / H features (head h
= features [h d, (h + 1) d) of q_proj), scale 1/sqrt(d); each branch has ONE key/value head of d features, shared
by every query head (keys from the key input, values from the value input). Options: block l, selected n,
window w.

    q_t = query_t Wq^T (per head)      g_t = sigmoid(query_t Wg^T + bg), read as (3, H): compression, selection,
                                                                          window gate per head
    compression:  kc_i = phi_k([kcmp_{il}, kcmp_{il+1}, ..., kcmp_{il+l-1}])   (the block's l keys concatenated in
                  vc_i = phi_v([vcmp_{il}, ..., vcmp_{il+l-1}])                 position order; phi: Linear(l d, d), phi_k without bias)
                  block i is visible to t iff i l + l - 1 <= t (complete);
                  P^h_t[i] = softmax over visible i of q^h_t . kc_i / sqrt(d),   o_cmp = sum_i P^h_t[i] vc_i
                  (o_cmp = 0 while no block is complete, t < l - 1)
    selection:    importance p_t[i] = sum_h q^h_t . kc_i / sqrt(d), the compression logits summed over the heads
                  (shared by the heads, as the paper's eq. 10 shares a GQA group's; the zoo sums logits, i.e. ranks
                  by the product of the heads' probabilities, where the paper sums probabilities);
                  candidates: the blocks i < c = floor(t / l); chosen: the n candidates of largest p_t (all of them
                  when there are fewer) and always the own block c;
                  o_slc = softmax attention of q^h_t over the k_slc keys at positions j <= t of the chosen blocks,
                  values v_slc
    window:       o_win = softmax attention over the k_win keys at 0 <= t - j <= w (at most w + 1), values v_win
    output_t = out_proj(concat_h [g[0, h] o_cmp^h + g[1, h] o_slc^h + g[2, h] o_win^h])

Two float64 forms of that are written here, independently of each other: the loop form (a Python loop over batch,
query and head: visible blocks, candidates and positions as explicit index lists, the top n by sorting, every
softmax an explicit exp and sum) and the mask form (boolean masks over blocks and positions for every query built
from index comparisons, the top n from pairwise rank counts, masked softmaxes over whole tensors). They are checked
against each other and against plain-Python scalar loops, then the module's forward and the registered reference
against them, the module's gradients (inputs and every parameter) against autograd through the mask form, and the
decoder (prefill, then one token at a time) against the forms, with the counted state bytes after every call
against

    state bytes = itemsize * batch * d * 2 * (t + min(t, w) + floor(t / l) + (t mod l))

after t tokens: every selection key and value (any block may be chosen later), the last min(t, w) window keys and
values (the next query sees w of them besides its own), the floor(t / l) compressed keys and values, and the raw
compression keys and values of the incomplete block. Then properties that follow from the math: with every block
chosen the selection branch is causal softmax attention, and so is the window branch with w >= n - 1; the
compression branch is zero before the first block completes; the selection is shared by the heads (moving one
head's queries moves another head's output); the output is causal; float32 agrees with float64.

Selection is discrete: no gradient flows through the importance scores (the top-n is piecewise constant), so the
forms take none through it either. Ties in p_t have probability zero for the continuous random inputs used here.
"""

import math

import pytest
import torch

import zoo
from zoo.decoding import counted_bytes

from paper_checks import make_inputs, close as _close, grads as _grads, causal_forward as _forward


NAME = "native-sparse"
D_MODEL = {1: 5, 2: 8, 3: 9}  # heads -> d_model: head sizes 5, 4 and 3
DEFAULTS = {"block": 64, "selected": 3, "window": 64}
FORMS_TOL = 1e-12    # the two paper forms against each other (relative to the output scale)
FORWARD_TOL = 1e-11  # the module / the registered reference / the decoder against the paper forms (relative)
GRAD_TOL = 1e-10     # gradients (relative to each gradient's scale)
FLOAT32_TOL = 1e-4   # float32 forward / decode against the float64 forms (relative)
LAYERS = ("q_proj", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "phi_k", "phi_v", "gate", "out_proj")


# --------------------------------------------------------------------------------------------------------------
# The independent float64 forms
# --------------------------------------------------------------------------------------------------------------

def _linear(x, layer):
    """x W^T (+ b), written out."""
    y = x @ layer.weight.transpose(0, 1)
    return y if layer.bias is None else y + layer.bias


def sizes(m):
    """(H, d, l) read from the parameter shapes: gate has 3 H outputs, every key head d, phi_k takes l d inputs."""
    heads = m.gate.out_features // 3
    d = m.k_cmp.out_features
    assert m.q_proj.out_features == heads * d and m.phi_k.in_features % d == 0
    return heads, d, m.phi_k.in_features // d


def paper_inputs(m, query, key, value):
    """q (batch, n, H, d); the six single-head keys and values (batch, n, d); gates (batch, n, 3, H)."""
    for t in (query, key, value):
        assert t.dtype == torch.float64
    heads, d, _ = sizes(m)
    batch, n = query.shape[:2]
    return dict(q=_linear(query, m.q_proj).reshape(batch, n, heads, d),
                kcmp=_linear(key, m.k_cmp), vcmp=_linear(value, m.v_cmp),
                kslc=_linear(key, m.k_slc), vslc=_linear(value, m.v_slc),
                kwin=_linear(key, m.k_win), vwin=_linear(value, m.v_win),
                g=torch.sigmoid(_linear(query, m.gate)).reshape(batch, n, 3, heads))


def _finish(m, o):
    """Concatenate the heads in order, (batch, n, H, d) -> (batch, n, d_model), and apply the output projection."""
    batch, n, heads, d = o.shape
    return _linear(o.reshape(batch, n, heads * d), m.out_proj)


def _mix(x, branches):
    """g[0, h] o_cmp^h + g[1, h] o_slc^h + g[2, h] o_win^h, (batch, n, H, d)."""
    g = x["g"]
    return sum(g[:, :, r, :, None] * o for r, o in enumerate(branches))


# (a) the loop form ----------------------------------------------------------------------------------------------

def _explicit_softmax_average(qv, keys, values, positions, scale):
    """sum_j e_j v_j / sum_j e_j with e_j = exp(q . k_j scale - max), over the listed positions (explicit exp, sum)."""
    idx = torch.tensor(positions, dtype=torch.long)
    logits = (keys.index_select(0, idx) * qv).sum(-1) * scale
    e = torch.exp(logits - logits.max().item())   # an exact shift: it cancels in the ratio
    return (e[:, None] * values.index_select(0, idx)).sum(0) / e.sum()


def loop_branches(m, query, key, value, selected, window, chosen_out=None):
    """The three branches, each (batch, n, H, d), query by query and head by head; ``chosen_out`` (a dict), when
    given, receives the chosen blocks of every (b, t)."""
    x = paper_inputs(m, query, key, value)
    heads, d, l = sizes(m)
    batch, n = query.shape[:2]
    scale = 1 / math.sqrt(d)
    blocks = n // l  # the complete blocks
    kc = [_linear(torch.cat([x["kcmp"][:, i * l + r] for r in range(l)], -1), m.phi_k) for i in range(blocks)]
    vc = [_linear(torch.cat([x["vcmp"][:, i * l + r] for r in range(l)], -1), m.phi_v) for i in range(blocks)]
    zero = torch.zeros(d, dtype=torch.float64)
    cmp_rows, slc_rows, win_rows = [], [], []
    for b in range(batch):
        cmp_b, slc_b, win_b = [], [], []
        for t in range(n):
            visible = [i for i in range(blocks) if i * l + l - 1 <= t]
            probs, o_cmp, head_logits = [], [], []
            for h in range(heads):
                qv = x["q"][b, t, h]
                if not visible:
                    probs.append({})
                    o_cmp.append(zero)
                    continue
                logits = [(qv * kc[i][b]).sum() * scale for i in visible]
                head_logits.append(dict(zip(visible, logits)))
                top = max(z.item() for z in logits)
                e = [torch.exp(z - top) for z in logits]
                total = sum(e)
                p = {i: e_i / total for i, e_i in zip(visible, e)}
                probs.append(p)
                o_cmp.append(sum(p[i] * vc[i][b] for i in visible))
            importance = {i: sum(head_logits[h][i].item() for h in range(heads)) for i in visible}
            c = t // l
            candidates = list(range(c))
            assert all(i in importance for i in candidates)  # every earlier block is complete
            ranked = sorted(candidates, key=lambda i: importance[i], reverse=True)
            chosen = sorted(set(ranked[:selected]) | {c})
            if chosen_out is not None:
                chosen_out[b, t] = chosen
            slc_positions = [j for i in chosen for j in range(i * l, i * l + l) if j <= t]
            win_positions = [j for j in range(n) if 0 <= t - j <= window]
            o_slc = [_explicit_softmax_average(x["q"][b, t, h], x["kslc"][b], x["vslc"][b], slc_positions, scale)
                     for h in range(heads)]
            o_win = [_explicit_softmax_average(x["q"][b, t, h], x["kwin"][b], x["vwin"][b], win_positions, scale)
                     for h in range(heads)]
            cmp_b.append(torch.stack(o_cmp))
            slc_b.append(torch.stack(o_slc))
            win_b.append(torch.stack(o_win))
        if n:
            cmp_rows.append(torch.stack(cmp_b))
            slc_rows.append(torch.stack(slc_b))
            win_rows.append(torch.stack(win_b))
    if not (batch and n):
        empty = x["q"].new_zeros(batch, n, heads, d)
        return x, (empty, empty, empty)
    return x, tuple(torch.stack(rows) for rows in (cmp_rows, slc_rows, win_rows))


def loop_form(m, query, key, value, selected, window):
    x, branches = loop_branches(m, query, key, value, selected, window)
    return _finish(m, _mix(x, branches))


# (b) the mask form ----------------------------------------------------------------------------------------------

def _masked_softmax_weights(logits, mask):
    """Softmax along the last dim over the entries where mask is True; rows with none give all zeros."""
    if not logits.numel():
        return logits
    top = torch.where(mask, logits, torch.full((), -math.inf, dtype=logits.dtype)).amax(-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros((), dtype=logits.dtype))
    e = torch.where(mask, torch.exp(torch.where(mask, logits - top, torch.zeros((), dtype=logits.dtype))),
                    torch.zeros((), dtype=logits.dtype))
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones((), dtype=logits.dtype))


def mask_branches(m, query, key, value, selected, window):
    """The three branches, each (batch, n, H, d), from per-query boolean masks over blocks and positions; and the
    chosen blocks (batch, n, blocks) and the importance scores (batch, n, blocks) behind them."""
    x = paper_inputs(m, query, key, value)
    _, d, l = sizes(m)
    batch, n = query.shape[:2]
    scale = 1 / math.sqrt(d)
    q = x["q"]
    blocks, all_blocks = n // l, -(-n // l)
    kc = _linear(x["kcmp"][:, :blocks * l].reshape(batch, blocks, l * d), m.phi_k)   # (batch, blocks, d)
    vc = _linear(x["vcmp"][:, :blocks * l].reshape(batch, blocks, l * d), m.phi_v)
    t_ = torch.arange(n).view(n, 1)
    i_ = torch.arange(all_blocks).view(1, all_blocks)
    j_ = torch.arange(n).view(1, n)

    visible = (i_[:, :blocks] * l + l - 1 <= t_)                                     # (t, i)
    logits = (q[:, :, :, None, :] * kc[:, None, None, :, :]).sum(-1) * scale        # (batch, t, H, i)
    P = _masked_softmax_weights(logits, visible[None, :, None, :])
    o_cmp = (P[..., None] * vc[:, None, None, :, :]).sum(3)

    importance = torch.zeros(batch, n, all_blocks, dtype=torch.float64)
    importance[..., :blocks] = logits.detach().sum(2)                                # (batch, t, i)
    own = t_ // l                                                                    # (t, 1)
    candidate = i_ < own                                                             # (t, i)
    # rank of block i among the candidates: how many candidates have a larger importance
    beats = candidate[None, :, None, :] & (importance[:, :, None, :] > importance[:, :, :, None])
    rank = beats.sum(-1)                                                             # (batch, t, i)
    chosen = (candidate[None] & (rank < selected)) | (i_ == own)[None]               # (batch, t, i)
    position_block = (j_ // l).expand(n, n)                                          # (t, j) -> the block of j
    in_chosen = torch.gather(chosen, 2, position_block[None].expand(batch, n, n))   # (batch, t, j)
    slc_mask = in_chosen & (j_ <= t_)[None]
    win_mask = ((t_ - j_ >= 0) & (t_ - j_ <= window))[None]

    def attend(mask, k, v):  # mask (batch or 1, t, j), k v (batch, j, d)
        s = (q[:, :, :, None, :] * k[:, None, None, :, :]).sum(-1) * scale          # (batch, t, H, j)
        w = _masked_softmax_weights(s, mask[:, :, None, :])
        return (w[..., None] * v[:, None, None, :, :]).sum(3)

    branches = (o_cmp, attend(slc_mask, x["kslc"], x["vslc"]), attend(win_mask, x["kwin"], x["vwin"]))
    return x, branches, dict(chosen=chosen, importance=importance)


def mask_form(m, query, key, value, selected, window):
    x, branches, _ = mask_branches(m, query, key, value, selected, window)
    return _finish(m, _mix(x, branches))


def selection_margin(m, query, key, value, selected, window):
    """The smallest gap, over every query with more candidates than ``selected``, between the importance of the
    last block chosen and the first left out (inf when no query has to choose): how far from a tie the choice is."""
    _, _, l = sizes(m)
    with torch.no_grad():
        importance = mask_branches(m, query, key, value, selected, window)[2]["importance"]
    margin = math.inf
    for t in range(query.shape[1]):
        c = t // l
        if c > selected:
            top = importance[:, t, :c].sort(-1, descending=True).values
            margin = min(margin, (top[:, selected - 1] - top[:, selected]).min().item())
    return margin


def paper_state_bytes(batch, context, d_model, heads, block, window, itemsize):
    """The decoding state after ``context`` tokens: every selection key and value (context), the window's last
    min(context, w) keys and values, the floor(context / l) compressed keys and values and the raw compression
    keys and values of the incomplete block (context mod l); each a d-vector (one shared head) of the input dtype."""
    d = d_model // heads
    entries = context + min(context, window) + context // block + context % block
    return itemsize * batch * d * 2 * entries


# --------------------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------------------

def randomize(m, seed):
    """Every weight drawn from a seeded generator at scale 1/sqrt(fan_in) (logits ~ N(0, 1) for unit-normal
    inputs); the gate bias ~ N(0, 1) (gates spread over (0, 1)), phi's biases ~ 0.3 N(0, 1)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for name in LAYERS:
            layer = getattr(m, name)
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64)
                               / math.sqrt(layer.in_features))
            if layer.bias is not None:
                scale = 1.0 if name == "gate" else 0.3
                layer.bias.copy_(scale * torch.randn(layer.bias.shape, generator=g, dtype=torch.float64))


class _Holder(torch.nn.Module):
    """The contract's parameters with no zoo module behind them."""

    def __init__(self, heads, d_model, block):
        super().__init__()
        d = d_model // heads
        self.q_proj = torch.nn.Linear(d_model, d_model, bias=False)
        for name in ("k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win"):
            setattr(self, name, torch.nn.Linear(d_model, d, bias=False))
        self.phi_k = torch.nn.Linear(block * d, d, bias=False)
        self.phi_v = torch.nn.Linear(block * d, d)
        self.gate = torch.nn.Linear(d_model, 3 * heads)
        self.out_proj = torch.nn.Linear(d_model, d_model, bias=False)
        self.double()


def make_holder(heads, seed, block, d_model=None):
    torch.manual_seed(seed)
    m = _Holder(heads, d_model or D_MODEL[heads], block)
    randomize(m, seed)
    return m


def options(block=None, selected=None, window=None):
    """The options to pass (None: the default) and the values the forms use."""
    given = {name: v for name, v in (("block", block), ("selected", selected), ("window", window)) if v is not None}
    return given, {**DEFAULTS, **given}


def make_module(registry, heads, seed, block=None, selected=None, window=None, d_model=None, dtype=torch.float64):
    torch.manual_seed(seed)
    given, _ = options(block, selected, window)
    module = zoo.create(NAME, d_model=d_model or D_MODEL[heads], num_heads=heads, registry=registry, **given)
    module = module.to(torch.float64)
    randomize(module, seed)
    return module.to(dtype)


def _isolate(module, branch):
    """Gates made exactly one-hot: gate weight 0, bias +1e4 for ``branch`` (0 cmp, 1 slc, 2 win), -1e4 elsewhere
    (sigmoid gives exactly 1 and 0 in float64)."""
    heads = module.gate.out_features // 3
    with torch.no_grad():
        module.gate.weight.zero_()
        bias = torch.full((3, heads), -1e4, dtype=module.gate.bias.dtype)
        bias[branch] = 1e4
        module.gate.bias.copy_(bias.reshape(-1))


# --------------------------------------------------------------------------------------------------------------
# The forms themselves
# --------------------------------------------------------------------------------------------------------------

def test_forms_equal_scalar_loops():
    """Both forms against plain-Python scalar loops over every index straight from the equations (batch 2, 2 heads
    of 2, l = 2, selected 2, w = 2, n = 9: queries with 3 candidates choose 2), with no zoo module involved."""
    heads, d, l, n_sel, w = 2, 2, 2, 2, 2
    d_model = heads * d
    m = make_holder(heads, 3, l, d_model)
    batch, n = 2, 9
    query, key, value = make_inputs(batch, n, d_model, 3)
    with torch.no_grad():
        loop = loop_form(m, query, key, value, n_sel, w)
        mask = mask_form(m, query, key, value, n_sel, w)

    W = lambda layer, f, c: layer.weight[f, c].item()
    B = lambda layer, f: 0.0 if layer.bias is None else layer.bias[f].item()
    proj = lambda xs, layer, f: sum(xs[c] * W(layer, f, c) for c in range(layer.in_features)) + B(layer, f)
    row = lambda x, b_, t: [x[b_, t, c].item() for c in range(d_model)]
    dot = lambda u, v: sum(a * b for a, b in zip(u, v))
    sigmoid = lambda z: 1.0 / (1.0 + math.exp(-z))

    def softmax_average(qv, keys, values):
        e = [math.exp(dot(qv, k) / math.sqrt(d)) for k in keys]
        return [sum(e_j * v[f] for e_j, v in zip(e, values)) / sum(e) for f in range(d)]

    checked, dropped = 0, 0
    for bi in range(batch):
        Q = [[proj(row(query, bi, t), m.q_proj, f) for f in range(d_model)] for t in range(n)]
        K = {name: [[proj(row(key, bi, t), getattr(m, name), f) for f in range(d)] for t in range(n)]
             for name in ("k_cmp", "k_slc", "k_win")}
        V = {name: [[proj(row(value, bi, t), getattr(m, name), f) for f in range(d)] for t in range(n)]
             for name in ("v_cmp", "v_slc", "v_win")}
        G = [[sigmoid(proj(row(query, bi, t), m.gate, k)) for k in range(3 * heads)] for t in range(n)]
        KC = [[proj([K["k_cmp"][i * l + r][e] for r in range(l) for e in range(d)], m.phi_k, f) for f in range(d)]
              for i in range(n // l)]
        VC = [[proj([V["v_cmp"][i * l + r][e] for r in range(l) for e in range(d)], m.phi_v, f) for f in range(d)]
              for i in range(n // l)]
        for t in range(n):
            qh = [Q[t][h * d:(h + 1) * d] for h in range(heads)]
            vis = [i for i in range(n // l) if i * l + l - 1 <= t]
            o_cmp, prob = [], []
            for h in range(heads):
                e = {i: math.exp(dot(qh[h], KC[i]) / math.sqrt(d)) for i in vis}
                p = {i: e[i] / sum(e.values()) for i in vis}
                prob.append(p)
                o_cmp.append([sum(p[i] * VC[i][f] for i in vis) for f in range(d)] if vis else [0.0] * d)
            c = t // l
            score = {i: sum(prob[h][i] for h in range(heads)) for i in range(c)}
            best = sorted(score, key=lambda i: -score[i])[:n_sel]
            dropped += c - len(best)
            positions = [j for j in range(t + 1) if j // l in best or j // l == c]
            window_positions = [j for j in range(t + 1) if t - j <= w]
            o = []
            for h in range(heads):
                o_slc = softmax_average(qh[h], [K["k_slc"][j] for j in positions], [V["v_slc"][j] for j in positions])
                o_win = softmax_average(qh[h], [K["k_win"][j] for j in window_positions],
                                        [V["v_win"][j] for j in window_positions])
                o += [G[t][h] * o_cmp[h][f] + G[t][heads + h] * o_slc[f] + G[t][2 * heads + h] * o_win[f]
                      for f in range(d)]
            for f in range(d_model):
                expected = sum(o[c_] * W(m.out_proj, f, c_) for c_ in range(d_model))
                assert abs(loop[bi, t, f].item() - expected) <= 1e-12, (bi, t, f, loop[bi, t, f].item(), expected)
                assert abs(mask[bi, t, f].item() - expected) <= 1e-12, (bi, t, f, mask[bi, t, f].item(), expected)
                checked += 1
    assert checked == batch * n * d_model
    assert dropped > 0  # the choice is not vacuous


FORM_CASES = [(1, 1, 1, 2, 1, 1), (2, 2, 2, 3, 2, 1), (1, 3, 3, 3, 1, 3), (2, 2, 4, 3, 2, 3),
              (2, 1, 23, 3, 1, 3), (1, 2, 23, 3, 2, 1), (2, 3, 23, 2, 1, 1), (1, 2, 19, 4, 2, 3),
              (2, 3, 40, 4, 1, 5), (1, 2, 300, 64, 3, 64), (1, 1, 0, 3, 1, 1)]


@pytest.mark.parametrize("batch, heads, n, block, selected, window", FORM_CASES)
def test_loop_and_mask_forms_agree(batch, heads, n, block, selected, window):
    """The two forms agree, branch by branch, on the chosen blocks, and in their gradients (inputs and every
    parameter); the choice leaves candidates out somewhere wherever there are more than ``selected``."""
    seed = FORM_CASES.index((batch, heads, n, block, selected, window))
    m = make_holder(heads, seed, block)
    query, key, value = (t.requires_grad_(True) for t in make_inputs(batch, n, D_MODEL[heads], seed))
    chosen_loop = {}
    x, loop = loop_branches(m, query, key, value, selected, window, chosen_loop)
    _, mask, extras = mask_branches(m, query, key, value, selected, window)
    for label, a, b in zip(("compression", "selection", "window"), loop, mask):
        _close(b, a, FORMS_TOL, f"{label} branch, mask vs loop form")
    dropped = 0
    for (b, t), chosen in chosen_loop.items():
        assert extras["chosen"][b, t].nonzero().flatten().tolist() == chosen, (b, t)
        dropped += t // block + 1 - len(chosen)
    if n > (selected + 1) * block:
        assert dropped > 0
    out_loop, out_mask = _finish(m, _mix(x, loop)), mask_form(m, query, key, value, selected, window)
    _close(out_mask, out_loop, FORMS_TOL, "mask vs loop form")
    if n and n < 100:
        g = torch.Generator().manual_seed(30_000 + seed)
        cotangent = torch.randn(out_loop.shape, generator=g, dtype=torch.float64)
        names = [name for name, _ in m.named_parameters()]
        tensors = [query, key, value] + [p for _, p in m.named_parameters()]
        for label, a, b in zip(["query", "key", "value"] + names, _grads(out_loop, cotangent, tensors),
                               _grads(out_mask, cotangent, tensors)):
            _close(b, a, FORMS_TOL * 10, f"gradient wrt {label}, mask vs loop form")


# --------------------------------------------------------------------------------------------------------------
# The module against the forms
# --------------------------------------------------------------------------------------------------------------

def test_module_has_the_contract_parameters(registry):
    heads, d_model, l = 3, 9, 4
    d = d_model // heads
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry, block=l, selected=2, window=5)
    shapes = {"q_proj": (d_model, d_model, False), "out_proj": (d_model, d_model, False),
              "phi_k": (d, l * d, False), "phi_v": (d, l * d, True), "gate": (3 * heads, d_model, True)}
    shapes.update({name: (d, d_model, False) for name in ("k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win")})
    for name, (out_features, in_features, bias) in shapes.items():
        layer = getattr(module, name)
        assert isinstance(layer, torch.nn.Linear), name
        assert (layer.out_features, layer.in_features, layer.bias is not None) == (out_features, in_features, bias), \
            name
    expected = {f"{n}.weight" for n in shapes} | {f"{n}.bias" for n, s in shapes.items() if s[2]}
    assert {name for name, _ in module.named_parameters()} == expected  # nothing else
    default = zoo.create(NAME, d_model=8, num_heads=2, registry=registry)
    assert default.phi_k.in_features == 64 * 4  # block 64 by default
    for bad in ({"block": 0}, {"selected": 0}, {"window": 0}, {"block": -1}):
        with pytest.raises(Exception):
            zoo.create(NAME, d_model=8, num_heads=2, registry=registry, **bad)


def test_attn_mask_and_non_causal_are_refused(registry):
    module = make_module(registry, 2, 1, block=2, selected=1, window=2)
    query, key, value = make_inputs(1, 4, 8, 1)
    with pytest.raises(Exception):
        module(query, key, value, attn_mask=torch.ones(4, 4, dtype=torch.bool).tril(), is_causal=True)
    with pytest.raises(Exception):
        module(query, key, value, attn_mask=None, is_causal=False)


def _small_cases():
    cases = []
    for i, (heads, block) in enumerate((h, l) for h in (1, 2, 3) for l in (2, 3, 4)):
        for k, n in enumerate(sorted({1, block - 1, block, block + 1, 23})):
            index = i * 5 + k
            cases.append((1 + index % 2, heads, n, block, 1 + (index // 2) % 2, (1, 3)[(index // 3) % 2]))
    return cases


CASES = _small_cases() + [
    (1, 2, 300, None, None, None),  # the defaults l = 64, n = 3, w = 64: 4 complete blocks, top 3 of 4 chosen
    (2, 1, 150, None, None, None),  # the defaults, 2 candidates at most: all chosen
    (2, 3, 300, None, 1, 100),      # top 1 of up to 4, a window wider than a block
    (2, 2, 40, 4, 2, 5),
    (1, 3, 37, 5, 3, 7),
    (2, 1, 50, 8, 2, 10),
]


@pytest.mark.parametrize("batch, heads, n, block, selected, window", CASES)
def test_forward_reference_and_gradients_match_the_paper(registry, batch, heads, n, block, selected, window):
    seed = CASES.index((batch, heads, n, block, selected, window))
    module = make_module(registry, heads, seed, block, selected, window)
    _, opt = options(block, selected, window)
    d_model = D_MODEL[heads]
    same = seed % 3 == 0  # self-attention (one tensor) in a third of the cases
    query, key, value = make_inputs(batch, n, d_model, seed, same)
    case = dict(batch=batch, heads=heads, n=n, **opt, same=same, seed=seed)
    sel, win = opt["selected"], opt["window"]

    with torch.no_grad():
        loop = loop_form(module, query, key, value, sel, win)
        mask = mask_form(module, query, key, value, sel, win)
        out = _forward(module, query, key, value)
        registered = registry.variant(NAME).reference(module, query, key, value, attn_mask=None, is_causal=True)
    _close(mask, loop, FORMS_TOL, f"mask vs loop form {case}")
    assert out.shape == (batch, n, d_model), case
    _close(out, loop, FORWARD_TOL, f"module forward vs loop form {case}")
    _close(out, mask, FORWARD_TOL, f"module forward vs mask form {case}")
    if n > (sel + 1) * opt["block"]:  # some query chooses: choosing every block instead gives another output
        with torch.no_grad():
            every = mask_form(module, query, key, value, n, win)
        assert (every - out).abs().max() > 1e-6, case
    assert registered.shape == (batch, n, d_model), case
    _close(registered.double(), loop, FORWARD_TOL, f"registered reference vs loop form {case}")
    _close(registered.double(), mask, FORWARD_TOL, f"registered reference vs mask form {case}")

    # gradients: the inputs and every parameter, for a random cotangent
    g = torch.Generator().manual_seed(40_000 + seed)
    cotangent = torch.randn(batch, n, d_model, generator=g, dtype=torch.float64)
    if same:
        x = query.clone().requires_grad_(True)
        inputs, labels, call = [x], ["x (query = key = value)"], (x, x, x)
    else:
        inputs = [t.clone().requires_grad_(True) for t in (query, key, value)]
        labels, call = ["query", "key", "value"], inputs
    params = dict(module.named_parameters())
    names = sorted(params)
    assert len(names) == 13
    tensors = inputs + [params[p] for p in names]
    got = _grads(_forward(module, *call), cotangent, tensors)
    want = _grads(mask_form(module, *call, sel, win), cotangent, tensors)
    for label, a, b in zip(labels + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label} {case}")
    grads = dict(zip(labels + names, got))
    if n >= 2 * opt["block"]:  # not vacuous: with two complete blocks every other parameter matters (with one,
        # its compression softmax is 1 and k_cmp, phi_k do not)
        assert all(w.abs().max() > 1e-6 for w in want), case


def test_empty_sequence(registry):
    for batch in (0, 1, 2):
        for heads in (1, 3):
            module = make_module(registry, heads, 40 + batch, block=2, selected=1, window=3)
            query, key, value = make_inputs(batch, 0, D_MODEL[heads], 40)
            with torch.no_grad():
                out = _forward(module, query, key, value)
            assert out.shape == (batch, 0, D_MODEL[heads]) and out.dtype == torch.float64, (batch, heads, out.shape)


# --------------------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------------------

def _sdpa(q, k, v):
    """Causal softmax attention, scale 1/sqrt(d), of H query heads (batch, n, H, d) over one key/value head
    (batch, n, d), by torch."""
    heads = q.shape[2]
    k = k[:, None].expand(-1, heads, -1, -1)
    v = v[:, None].expand(-1, heads, -1, -1)
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True).transpose(1, 2)


@pytest.mark.parametrize("heads, n, block, selected", [(1, 23, 3, 7), (2, 23, 3, 8), (3, 17, 4, 4), (2, 300, 64, 4)])
def test_choosing_every_block_is_causal_softmax(registry, heads, n, block, selected):
    """With the selection gate alone open and ``selected`` at least the number of earlier blocks, the output is
    ordinary causal softmax attention over k_slc, v_slc (torch's SDPA); with one block fewer chosen it is not (for
    the last query)."""
    batch = 2
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 90 + n)
    outs = {}
    for s in (selected - 1, selected):
        module = make_module(registry, heads, 90 + n, block, s, 2)
        _isolate(module, 1)
        with torch.no_grad():
            outs[s] = _forward(module, query, key, value)
    assert (n - 1) // block <= selected
    with torch.no_grad():
        x = paper_inputs(module, query, key, value)
        expected = _finish(module, _sdpa(x["q"], x["kslc"], x["vslc"]))
    _close(outs[selected], expected, FORWARD_TOL, f"every block chosen vs causal softmax {(heads, n, block)}")
    if (n - 1) // block == selected:
        assert (outs[selected - 1][:, -1] - expected[:, -1]).abs().max() > 1e-6


@pytest.mark.parametrize("heads, n, window", [(1, 9, 8), (2, 9, 20), (3, 70, 69), (2, 64, None)])
def test_a_window_covering_the_sequence_is_causal_softmax(registry, heads, n, window):
    """With the window gate alone open and w >= n - 1, the output is causal softmax attention over k_win, v_win;
    w = n - 2 drops key 0 for the last query."""
    batch = 2
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 95 + n)
    module = make_module(registry, heads, 95 + n, 3, 1, window)
    _isolate(module, 2)
    with torch.no_grad():
        out = _forward(module, query, key, value)
        x = paper_inputs(module, query, key, value)
        expected = _finish(module, _sdpa(x["q"], x["kwin"], x["vwin"]))
    _close(out, expected, FORWARD_TOL, f"w={window} >= n - 1 vs causal softmax")
    narrow = make_module(registry, heads, 95 + n, 3, 1, n - 2)
    _isolate(narrow, 2)
    with torch.no_grad():
        out = _forward(narrow, query, key, value)
    _close(out[:, :-1], expected[:, :-1], FORWARD_TOL, "w = n - 2: the first n - 1 tokens see all keys")
    assert (out[:, -1] - expected[:, -1]).abs().max() > 1e-6


@pytest.mark.parametrize("heads, n, block", [(1, 10, 3), (2, 9, 4), (3, 5, 6), (2, 130, None)])
def test_compression_branch(registry, heads, n, block):
    """With the compression gate alone open the output is out_proj of the compression branch (both forms agree on
    it), exactly zero while no block is complete (t < l - 1)."""
    batch = 2
    module = make_module(registry, heads, 100 + n, block, 1, 2)
    _isolate(module, 0)
    l = block or 64
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 100 + n)
    with torch.no_grad():
        out = _forward(module, query, key, value)
        _, (o_cmp, _, _) = loop_branches(module, query, key, value, 1, 2)
        _, (o_cmp2, _, _), _ = mask_branches(module, query, key, value, 1, 2)
    _close(o_cmp2, o_cmp, FORMS_TOL, "compression branch, mask vs loop form")
    _close(out, _finish(module, o_cmp), FORWARD_TOL, "compression branch alone")
    assert (out[:, :min(n, l - 1)] == 0).all()
    if n >= l:
        assert (out[:, l - 1:].abs().amax(-1) > 1e-6).all()


def test_selection_is_shared_by_the_heads(registry):
    """The importance sums the compression logits of every head, so every head attends to the same blocks:
    changing only head 1's query weights changes the blocks head 0 sees, and with them head 0's selection output
    (out_proj = I, the selection gate alone), exactly as the forms say; per-head choices would leave it alone."""
    heads, n, l, sel = 2, 30, 3, 1
    d_model = D_MODEL[heads]
    d = d_model // heads
    query, key, value = make_inputs(1, n, d_model, 110)
    module = make_module(registry, heads, 110, l, sel, 1)
    _isolate(module, 1)
    with torch.no_grad():
        module.out_proj.weight.copy_(torch.eye(d_model, dtype=torch.float64))
        before = _forward(module, query, key, value)
        g = torch.Generator().manual_seed(111)
        module.q_proj.weight[d:] = 4 * torch.randn(d, d_model, generator=g, dtype=torch.float64)
        after = _forward(module, query, key, value)
        expected = loop_form(module, query, key, value, sel, 1)
    _close(after, expected, FORWARD_TOL, "after changing head 1's queries")
    assert (after[..., :d] - before[..., :d]).abs().max() > 1e-3


@pytest.mark.parametrize("heads, block, selected, window", [(2, 3, 1, 3), (3, 2, 2, 1), (1, 4, 1, 5)])
def test_output_is_causal(registry, heads, block, selected, window):
    """Changing query, key and value from token t on leaves the outputs before t exactly as they were."""
    batch, n = 2, 17
    module = make_module(registry, heads, 11, block, selected, window)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 11)
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        base = _forward(module, query, key, value)
        for t in (0, 1, 4, 6, 11, 16):
            moved = [x.clone() for x in (query, key, value)]
            for x in moved:
                x[:, t:] += torch.randn(x[:, t:].shape, generator=g, dtype=torch.float64)
            out = _forward(module, *moved)
            _close(out[:, :t], base[:, :t], 1e-13, f"outputs before t={t} after changing tokens >= t")
            assert (out[:, t] - base[:, t]).abs().max() > 1e-6  # and token t itself does move


@pytest.mark.parametrize("heads, n, block, selected, window", [(2, 40, 4, 2, 5), (3, 300, None, None, None)])
def test_float32_forward(registry, heads, n, block, selected, window):
    """The float32 module agrees with the float64 forms (the choice of blocks is far from a tie here)."""
    batch = 2
    seed = 120 + n
    module64 = make_module(registry, heads, seed, block, selected, window)
    module = make_module(registry, heads, seed, block, selected, window, dtype=torch.float32)
    _, opt = options(block, selected, window)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed)
    with torch.no_grad():
        assert selection_margin(module64, query, key, value, opt["selected"], opt["window"]) > 1e-4
        expected = mask_form(module64, query, key, value, opt["selected"], opt["window"])
        out = _forward(module, query.float(), key.float(), value.float())
    _close(out, expected, FLOAT32_TOL, "float32 forward vs float64 mask form", dtype=torch.float32)


# --------------------------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------------------------

def _decode(dec, module, query, key, value, prefill, on_state=None):
    """Prefill of the first ``prefill`` tokens, then one step per token (each given copies of its own); the outputs
    concatenated. ``on_state(t, state)`` sees the state after each call, t tokens of context in it."""
    out, state = dec.prefill(module, query[:, :prefill].clone(), key[:, :prefill].clone(),
                             value[:, :prefill].clone())
    assert out.shape == (query.shape[0], prefill, query.shape[2]), (prefill, tuple(out.shape))
    if on_state:
        on_state(prefill, state)
    outs = [out]
    for t in range(prefill, query.shape[1]):
        token = slice(t, t + 1)
        out_t, state = dec.step(module, state, query[:, token].clone(), key[:, token].clone(), value[:, token].clone())
        assert out_t.shape == (query.shape[0], 1, query.shape[2]), (t, tuple(out_t.shape))
        outs.append(out_t)
        if on_state:
            on_state(t + 1, state)
    return torch.cat(outs, 1)


def _declared(dec, module, batch, context, itemsize, opt):
    heads = module.gate.out_features // 3
    return dec.state_bytes(batch, context, module.out_proj.in_features, heads, itemsize, **opt)


def _bytes_check(dec, module, batch, itemsize, given, opt):
    heads = module.gate.out_features // 3
    d_model = module.out_proj.in_features

    def check(t, state):
        counted = counted_bytes(state)
        formula = paper_state_bytes(batch, t, d_model, heads, opt["block"], opt["window"], itemsize)
        declared = _declared(dec, module, batch, t, itemsize, given)
        assert counted == formula, f"after {t} tokens: counted {counted} bytes, the formula {formula} ({opt})"
        assert declared == formula, f"after {t} tokens: declared state_bytes {declared}, the formula {formula}"

    return check


DECODE_CASES = [(2, 11, 3, 1, 3), (1, 9, 2, 2, 1), (3, 13, 4, 2, 3), (2, 23, 3, 2, 1), (1, 300, None, None, None)]


@pytest.mark.parametrize("heads, n, block, selected, window", DECODE_CASES)
def test_decoder_matches_the_forward(registry, heads, n, block, selected, window):
    """Prefill of p tokens then single-token steps equals the forms and the forward for p in {0, 1, n//2, n-1, n},
    batch 2 (batch 1 for the default options at n = 300); the counted state bytes after every call equal the
    formula and the declared state_bytes."""
    batch = 1 if n > 100 else 2
    seed = 600 + heads * 10 + n
    module = make_module(registry, heads, seed, block, selected, window)
    given, opt = options(block, selected, window)
    dec = registry.variant(NAME).decoder
    assert dec is not None and dec.state_bytes is not None
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed)
    with torch.no_grad():
        mask = mask_form(module, query, key, value, opt["selected"], opt["window"])
        forward = _forward(module, query, key, value)
    _close(forward, mask, FORWARD_TOL, "forward vs mask form")
    check = _bytes_check(dec, module, batch, 8, given, opt)
    for prefill in sorted({0, 1, n // 2, n - 1, n}):
        case = dict(heads=heads, n=n, **opt, prefill=prefill)
        with torch.no_grad():
            decoded = _decode(dec, module, query, key, value, prefill, check)
        _close(decoded, mask, FORWARD_TOL, f"decode vs mask form {case}")
        _close(decoded, forward, FORWARD_TOL, f"decode vs forward {case}")


@pytest.mark.parametrize("heads, n, block, selected, window", DECODE_CASES[:1] + DECODE_CASES[3:])
def test_decoder_in_float32(registry, heads, n, block, selected, window):
    """The same decode in float32: close to the float64 forms; the counted state bytes after every call equal the
    formula and the declared state_bytes for itemsize 4."""
    batch = 1 if n > 100 else 2
    seed = 700 + heads * 10 + n
    module64 = make_module(registry, heads, seed, block, selected, window)
    module = make_module(registry, heads, seed, block, selected, window, dtype=torch.float32)
    given, opt = options(block, selected, window)
    dec = registry.variant(NAME).decoder
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed)
    with torch.no_grad():
        assert selection_margin(module64, query, key, value, opt["selected"], opt["window"]) > 1e-4
        expected = mask_form(module64, query, key, value, opt["selected"], opt["window"])
    q32, k32, v32 = (x.float() for x in (query, key, value))
    check = _bytes_check(dec, module, batch, 4, given, opt)
    for prefill in sorted({0, 1, n // 2, n - 1}):
        case = dict(heads=heads, n=n, **opt, prefill=prefill)
        with torch.no_grad():
            decoded = _decode(dec, module, q32, k32, v32, prefill, check)
        _close(decoded, expected, FLOAT32_TOL, f"float32 decode vs float64 mask form {case}", dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("heads, block, window", [(2, 3, 2), (3, 2, 5), (1, 4, 1)])
def test_decoder_state_bytes_follow_the_formula(registry, dtype, heads, block, window):
    """After t tokens: itemsize * batch * d * 2 * (t + min(t, w) + floor(t / l) + (t mod l)). The counted bytes after
    a prefill of 0, 1, 2 and l tokens and after every step up to t = 2 max(l, w) + 3 (blocks completing, the window
    full and sliding), and the declared state_bytes, equal it."""
    batch = 2
    module = make_module(registry, heads, 800 + heads, block, 1, window, dtype=dtype)
    given, opt = options(block, 1, window)
    dec = registry.variant(NAME).decoder
    n = 2 * max(block, window) + 3
    query, key, value = (x.to(dtype) for x in make_inputs(batch, n, D_MODEL[heads], 800 + heads))
    check = _bytes_check(dec, module, batch, query.element_size(), given, opt)
    seen = []

    def on_state(t, state):
        seen.append(t)
        check(t, state)

    with torch.no_grad():
        for prefill in (0, 1, 2, block):
            _decode(dec, module, query, key, value, prefill, on_state)
    assert seen[-1] == n and set(seen) == set(range(n + 1))


def test_decoder_prefill_of_nothing(registry):
    """A prefill of no tokens returns an empty output and a state of no bytes, as declared."""
    heads, batch = 2, 2
    module = make_module(registry, heads, 77, block=3, selected=1, window=2)
    query, key, value = make_inputs(batch, 0, D_MODEL[heads], 77)
    dec = registry.variant(NAME).decoder
    with torch.no_grad():
        out, state = dec.prefill(module, query, key, value)
    assert out.shape == (batch, 0, D_MODEL[heads])
    assert counted_bytes(state) == 0 == _declared(dec, module, batch, 0, 8, {"block": 3, "selected": 1, "window": 2})
