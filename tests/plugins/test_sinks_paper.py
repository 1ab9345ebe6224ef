"""An independent check of the "sinks" variant (gpt-oss model card, OpenAI 2025: learned attention sinks; cf.
off-by-one attention), written from the paper's equations and the calling contract only, not from the fast path.

Each head h has a learned scalar sink logit s_h that joins every query row's softmax denominator with no value:

    w_ij = exp(q_i . k_j / sqrt(d)) / (exp(s_h) + sum_{j' allowed for i} exp(q_i . k_j' / sqrt(d)))
    o_i  = sum_{j allowed} w_ij v_j          (a row with no allowed key gives o_i = 0)

around the usual projections (q, k, v in; heads of d = d_model / H features, concatenated in order; out).

The reference below computes that in float64 as plainly as it can: one head at a time, explicit dot products,
explicit exp and sums with the row maximum (sink included) subtracted, rather than "append a sink column to the
scores and softmax". The module's forward and the variant's registered reference are compared with it, and the
module's gradients with autograd through it; then two properties that follow from the math are checked.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import zoo


NAME = "sinks"
HEAD_DIM = 5  # d: not a power of two, so 1/sqrt(d) is not exact
FORWARD_TOL = 1e-12
GRAD_TOL = 1e-10


# --------------------------------------------------------------------------------------------------------------
# The independent float64 reference
# --------------------------------------------------------------------------------------------------------------

def allowed_pairs(attn_mask, is_causal, batch, heads, q_len, k_len):
    """(batch, heads, q_len, k_len) booleans: query i may attend key j. ``attn_mask`` broadcasts as in torch
    SDPA (True = may attend); causal (top-left aligned): j <= i; the two combine by AND."""
    allowed = torch.ones(batch, heads, q_len, k_len, dtype=torch.bool)
    if attn_mask is not None:
        allowed = allowed & attn_mask
    if is_causal:
        i = torch.arange(q_len).view(q_len, 1)
        j = torch.arange(k_len).view(1, k_len)
        allowed = allowed & (j <= i)
    return allowed


def _project(x, linear):
    """x W^T + b, written out."""
    return x @ linear.weight.transpose(0, 1) + linear.bias


def paper_head_weights(module, query, key, attn_mask=None, is_causal=False):
    """The attention weights w_ij of every head, a list of H tensors (batch, q_len, k_len), per the paper."""
    heads, d_model = module.num_heads, module.d_model
    d = d_model // heads
    q, k = _project(query, module.q_proj), _project(key, module.k_proj)
    batch, q_len, k_len = query.shape[0], query.shape[1], key.shape[1]
    allowed = allowed_pairs(attn_mask, is_causal, batch, heads, q_len, k_len)
    minus_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    weights = []
    for h in range(heads):
        features = slice(h * d, (h + 1) * d)
        q_h, k_h = q[..., features], k[..., features]                        # (batch, len, d)
        score = (q_h[:, :, None, :] * k_h[:, None, :, :]).sum(-1) / math.sqrt(d)  # (batch, q_len, k_len)
        ok = allowed[:, h]
        sink = module.sinks[h]
        # the row max over the allowed scores and the sink; the result does not depend on it, so it is a constant
        shift = torch.maximum(torch.where(ok, score, minus_inf).amax(-1), sink).detach()
        numerator = torch.exp(torch.where(ok, score - shift[..., None], minus_inf))  # exactly 0 where not allowed
        denominator = torch.exp(sink - shift) + numerator.sum(-1)                  # >= exp(s_h - shift) > 0
        weights.append(numerator / denominator[..., None])
    return weights


def paper_attention(module, query, key, value, attn_mask=None, is_causal=False):
    """The layer's output per the paper, in float64 (differentiable in the inputs and the module's parameters)."""
    for x in (query, key, value):
        assert x.dtype == torch.float64
    heads, d = module.num_heads, module.d_model // module.num_heads
    v = _project(value, module.v_proj)
    outputs = []
    for h, w in enumerate(paper_head_weights(module, query, key, attn_mask, is_causal)):
        v_h = v[..., h * d:(h + 1) * d]                                          # (batch, k_len, d)
        outputs.append((w[..., None] * v_h[:, None, :, :]).sum(-2))              # o_i = sum_j w_ij v_j
    return _project(torch.cat(outputs, dim=-1), module.out_proj)


# --------------------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------------------

def make_module(registry, heads, seed, sink_scale=3.0):
    """A float64 sinks module, every parameter drawn from a seeded generator (random biases, sinks of a few
    units, not the zeros they start at)."""
    torch.manual_seed(seed)
    d_model = heads * HEAD_DIM
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry).double()
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for linear in (module.q_proj, module.k_proj, module.v_proj, module.out_proj):
            linear.weight.copy_(torch.randn(d_model, d_model, generator=g, dtype=torch.float64) / math.sqrt(d_model))
            linear.bias.copy_(0.5 * torch.randn(d_model, generator=g, dtype=torch.float64))
        module.sinks.copy_(sink_scale * torch.randn(heads, generator=g, dtype=torch.float64))
    return module


def make_inputs(batch, q_len, k_len, d_model, seed, scale=2.0):
    g = torch.Generator().manual_seed(20_000 + seed)
    query = scale * torch.randn(batch, q_len, d_model, generator=g, dtype=torch.float64)
    key = scale * torch.randn(batch, k_len, d_model, generator=g, dtype=torch.float64)
    value = torch.randn(batch, k_len, d_model, generator=g, dtype=torch.float64)
    return query, key, value


MASK_SHAPES = {
    None: None,
    "qk": lambda b, h, q, k: (q, k),
    "b1qk": lambda b, h, q, k: (b, 1, q, k),
    "1hqk": lambda b, h, q, k: (1, h, q, k),
    "bhqk": lambda b, h, q, k: (b, h, q, k),
    "b11k": lambda b, h, q, k: (b, 1, 1, k),  # key padding
}


def make_mask(kind, batch, heads, q_len, k_len, seed, empty_rows=True):
    """A random boolean mask of the named shape (True = may attend). With ``empty_rows`` some query rows are
    entirely False (query row 1, and for per-head masks row 0 of the last head); without, every row keeps key
    0 (so every row has an allowed key, also under causal)."""
    if kind is None:
        return None
    shape = MASK_SHAPES[kind](batch, heads, q_len, k_len)
    g = torch.Generator().manual_seed(30_000 + seed)
    mask = torch.rand(shape, generator=g) > 0.35
    if empty_rows:
        if shape[-2] > 1:
            mask[..., 1, :] = False
        if kind in ("1hqk", "bhqk"):
            mask[..., -1, 0, :] = False
    else:
        mask[..., 0] = True
    return mask


def _grads(output, cotangent, tensors):
    grads = torch.autograd.grad(output, tensors, grad_outputs=cotangent, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads)]


def _close(got, expected, tol, what):
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    assert torch.isfinite(got).all(), (what, "non-finite values", got)
    error = (got - expected).abs().max().item() if got.numel() else 0.0
    assert error <= tol, f"{what}: max |got - expected| = {error:.3e} > {tol:.0e}\ngot={got}\nexpected={expected}"


# --------------------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------------------

def test_reference_equals_a_loop_over_every_query_and_key():
    """The reference itself, against scalar loops over batch, head, query and key straight from the equations
    (no shift, plain Python floats), with a mask, causal, an empty row and q_len != k_len."""
    class Holder(torch.nn.Module):
        def __init__(self, heads, d_model):
            super().__init__()
            self.num_heads, self.d_model = heads, d_model
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (torch.nn.Linear(d_model, d_model).double()
                                                                    for _ in range(4))
            self.sinks = torch.nn.Parameter(torch.zeros(heads, dtype=torch.float64))

    g = torch.Generator().manual_seed(7)
    heads, d = 2, 3
    d_model = heads * d
    module = Holder(heads, d_model)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    batch, q_len, k_len = 2, 4, 3
    query, key, value = (torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for n in (q_len, k_len, k_len))
    mask = torch.rand(batch, 1, q_len, k_len, generator=g) > 0.3
    mask[1, 0, 2, :] = False
    out = paper_attention(module, query, key, value, attn_mask=mask, is_causal=True).detach()

    W = {"q": module.q_proj, "k": module.k_proj, "v": module.v_proj, "o": module.out_proj}
    proj = lambda x, lin, b, t, f: sum(x[b, t, c].item() * lin.weight[f, c].item() for c in range(d_model)) + lin.bias[f].item()
    for b in range(batch):
        o = [[0.0] * d_model for _ in range(q_len)]
        for h in range(heads):
            s = module.sinks[h].item()
            for i in range(q_len):
                qi = [proj(query, W["q"], b, i, h * d + c) for c in range(d)]
                keys = [j for j in range(k_len) if mask[b, 0, i, j] and j <= i]
                e = {j: math.exp(sum(qi[c] * proj(key, W["k"], b, j, h * d + c) for c in range(d)) / math.sqrt(d))
                     for j in keys}
                z = math.exp(s) + sum(e.values())
                for c in range(d):
                    o[i][h * d + c] = sum(e[j] / z * proj(value, W["v"], b, j, h * d + c) for j in keys)
        for i in range(q_len):
            for f in range(d_model):
                expected = sum(o[i][c] * W["o"].weight[f, c].item() for c in range(d_model)) + W["o"].bias[f].item()
                assert abs(out[b, i, f].item() - expected) <= 1e-12, (b, i, f, out[b, i, f].item(), expected)


def test_module_has_the_contract_parameters(registry):
    module = zoo.create(NAME, d_model=12, num_heads=3, registry=registry)
    assert module.num_heads == 3 and module.d_model == 12
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        linear = getattr(module, name)
        assert isinstance(linear, torch.nn.Linear) and linear.bias is not None
        assert (linear.in_features, linear.out_features) == (12, 12)
    assert isinstance(module.sinks, torch.nn.Parameter) and module.sinks.shape == (3,)
    assert torch.equal(module.sinks.detach(), torch.zeros(3))
    expected = {f"{p}_proj.{t}" for p in ("q", "k", "v", "out") for t in ("weight", "bias")} | {"sinks"}
    assert {name for name, _ in module.named_parameters()} == expected  # nothing the paper's layer lacks


CASES = [(batch, heads, q_len, k_len, causal, mask)
         for batch in (0, 1, 2)
         for heads in (1, 3)
         for q_len, k_len in ((5, 7), (7, 4), (6, 6))
         for causal in (False, True)
         for mask in MASK_SHAPES]


@pytest.mark.parametrize("batch, heads, q_len, k_len, causal, mask_kind", CASES)
def test_forward_reference_and_gradients_match_the_paper(registry, batch, heads, q_len, k_len, causal, mask_kind):
    seed = CASES.index((batch, heads, q_len, k_len, causal, mask_kind))
    module = make_module(registry, heads, seed)
    query, key, value = make_inputs(batch, q_len, k_len, module.d_model, seed)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, seed)
    case = dict(batch=batch, heads=heads, q_len=q_len, k_len=k_len, causal=causal, mask=mask_kind, seed=seed)

    with torch.no_grad():
        expected = paper_attention(module, query, key, value, attn_mask=mask, is_causal=causal)
        out = module(query, key, value, attn_mask=mask, is_causal=causal)
        registered = registry.variant(NAME).reference(module, query, key, value, attn_mask=mask, is_causal=causal)
    assert out.dtype == torch.float64 and out.shape == (batch, q_len, module.d_model), case
    _close(out, expected, FORWARD_TOL, f"module forward {case}")
    _close(registered.double(), expected, FORWARD_TOL, f"registered reference {case}")

    # a row that no head may attend from gets o_i = 0: the output is the output projection's bias
    allowed = allowed_pairs(mask, causal, batch, heads, q_len, k_len)
    empty = ~allowed.any(-1).any(1)  # (batch, q_len)
    if empty.any():
        _close(out[empty], module.out_proj.bias.detach().expand(int(empty.sum()), -1), FORWARD_TOL,
               f"empty rows give out_proj.bias {case}")

    # gradients: the inputs, the sinks and every other parameter, for a random cotangent
    g = torch.Generator().manual_seed(40_000 + seed)
    cotangent = torch.randn(batch, q_len, module.d_model, generator=g, dtype=torch.float64)
    inputs = [x.clone().requires_grad_(True) for x in (query, key, value)]
    names = ["query", "key", "value", "sinks"] + [n for n, _ in module.named_parameters() if n != "sinks"]
    params = dict(module.named_parameters())
    tensors = inputs + [params[n] for n in names[3:]]
    got = _grads(module(*inputs, attn_mask=mask, is_causal=causal), cotangent, tensors)
    want = _grads(paper_attention(module, *inputs, attn_mask=mask, is_causal=causal), cotangent, tensors)
    for name, a, b in zip(names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {name} {case}")


def _sdpa_multi_head(module, query, key, value, attn_mask, is_causal):
    """Plain softmax multi-head attention of the module's own projections, by torch SDPA."""
    heads = module.num_heads
    split = lambda x: x.unflatten(-1, (heads, -1)).transpose(1, 2)
    q, k, v = (split(layer(x)) for layer, x in ((module.q_proj, query), (module.k_proj, key), (module.v_proj, value)))
    if attn_mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    else:
        if is_causal:
            attn_mask = attn_mask & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return module.out_proj(o.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("batch, heads, q_len, k_len, causal, mask_kind",
                         [(2, 3, 5, 7, False, None), (2, 3, 7, 4, True, None), (1, 1, 5, 8, True, None),
                          (2, 3, 6, 4, False, "b1qk"), (1, 3, 4, 6, True, "1hqk"), (2, 1, 6, 6, False, "qk"),
                          (2, 3, 5, 5, True, "bhqk"), (0, 3, 4, 5, False, "b11k")])
def test_sinks_at_minus_infinity_give_plain_softmax_attention(registry, batch, heads, q_len, k_len, causal, mask_kind):
    """exp(s_h) -> 0 leaves the ordinary softmax denominator. Masks keep key 0 in every row here (SDPA's fully
    masked rows are its own convention, not the paper's)."""
    seed = 1000 + batch * 100 + heads * 10 + q_len
    module = make_module(registry, heads, seed)
    with torch.no_grad():
        module.sinks.fill_(-1e4)
    query, key, value = make_inputs(batch, q_len, k_len, module.d_model, seed)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, seed, empty_rows=False)
    with torch.no_grad():
        plain = _sdpa_multi_head(module, query, key, value, mask, causal)
        ours = paper_attention(module, query, key, value, attn_mask=mask, is_causal=causal)
        out = module(query, key, value, attn_mask=mask, is_causal=causal)
    _close(ours, plain, FORWARD_TOL, "reference vs SDPA at s = -1e4")
    _close(out, plain, FORWARD_TOL, f"module vs SDPA at s = -1e4 {(batch, heads, q_len, k_len, causal, mask_kind)}")

    with torch.no_grad():  # and with the sinks finite, the same inputs do not give plain attention
        module.sinks.fill_(1.0)
        moved = module(query, key, value, attn_mask=mask, is_causal=causal)
    if batch:
        assert (moved - plain).abs().max() > 1e-3


@pytest.mark.parametrize("heads, q_len, k_len, causal, mask_kind",
                         [(3, 5, 7, False, None), (3, 7, 4, True, None), (1, 6, 6, True, "qk"),
                          (3, 6, 5, False, "bhqk"), (3, 4, 6, True, "1hqk")])
def test_weight_on_real_keys_is_below_one(registry, heads, q_len, k_len, causal, mask_kind):
    """With every value vector made all ones (v_proj: W = 0, b = 1; out_proj the identity), each output feature
    of head h is that row's total weight on real keys: sum_j w_ij = Z / (Z + exp(s_h)) < 1, where
    Z = sum_j exp(score_ij) (and 0 for a row with no allowed key). Derived from the reference alone."""
    seed = 2000 + heads * 100 + q_len * 10 + k_len
    batch = 2
    module = copy.deepcopy(make_module(registry, heads, seed))
    d_model, d = module.d_model, module.d_model // heads
    with torch.no_grad():
        module.v_proj.weight.zero_()
        module.v_proj.bias.fill_(1.0)
        module.out_proj.weight.copy_(torch.eye(d_model, dtype=torch.float64))
        module.out_proj.bias.zero_()
        module.sinks.copy_(torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)[:heads])
    query, key, value = make_inputs(batch, q_len, k_len, d_model, seed, scale=1.0)
    mask = make_mask(mask_kind, batch, heads, q_len, k_len, seed)
    with torch.no_grad():
        total = paper_attention(module, query, key, value, attn_mask=mask, is_causal=causal)
        total = total.unflatten(-1, (heads, d))                                  # (batch, q_len, heads, d)
    assert torch.equal(total, total[..., :1].expand_as(total))                   # one number per head and row
    total = total[..., 0].transpose(1, 2)                                        # (batch, heads, q_len)

    # the same total in closed form: sigmoid(logsumexp_j(score_ij) - s_h)
    allowed = allowed_pairs(mask, causal, batch, heads, q_len, k_len)
    q = module.q_proj(query).unflatten(-1, (heads, d)).transpose(1, 2)
    k = module.k_proj(key).unflatten(-1, (heads, d)).transpose(1, 2)
    with torch.no_grad():
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
        closed = torch.sigmoid(torch.logsumexp(scores, -1) - module.sinks.view(1, heads, 1))
    _close(total, closed, FORWARD_TOL, "total weight vs Z / (Z + exp(s))")

    has_keys = allowed.any(-1)
    assert (total < 1).all() and (total >= 0).all()
    assert (total[has_keys] > 0).all() and (total[~has_keys] == 0).all()
    assert (1 - total[has_keys]).min() > 1e-3  # the sinks take a real share, not a rounding error
