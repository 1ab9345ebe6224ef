"""An independent check of the "based" variant (Based, Arora, Eyuboglu, Zhang, Timalsina, Alberti, Zinsley, Zou,
Rudra & Re, ICML 2024: "Simple linear attention language models balance the recall-throughput tradeoff"), written
from the paper's equations and the calling contract only, not from the fast path.

One layer, two branches summed. With H heads, F Taylor features per head (head h of the F-wide projections =
features [h F, (h + 1) F)) and d = d_model / H value features per head (head h = features [h d, (h + 1) d)):

    a_t = query_t Wqf^T   b_t = key_t Wkf^T                                   (F per head)
    q_t = query_t Wqw^T   k_t = key_t Wkw^T   v_t = value_t Wv^T              (d per head)

    linear branch (2nd-order Taylor of exp):
        s_ij = a_i . b_j / sqrt(F),   w_ij = 1 + s_ij + s_ij^2 / 2   (>= 1/2 > 0),
        y_i = sum_{j<=i} w_ij v_j / sum_{j<=i} w_ij
      = the feature map phi(x) = [1, x / F^(1/4), vec(x x^T) / sqrt(2F)], phi(a) . phi(b) = w, read recurrently:
        S_t = S_{t-1} + phi(b_t) v_t^T,  z_t = z_{t-1} + phi(b_t),  y_t = phi(a_t)^T S_t / phi(a_t)^T z_t
    window branch: exact softmax of q_i . k_j / sqrt(d) over the keys 0 <= i - j <= W (W + 1 keys), values v_j
    output = (y_linear + y_window), heads concatenated in order, times Wo^T.

Two float64 forms of that are written here, independently of each other: the recurrent form (a Python loop over t
with the explicit feature map and running sums S, z, and the window branch as an explicit loop over the allowed
keys with exp and a sum) and the quadratic form (the Taylor weights w_ij written out, no feature map; the window
branch from an explicit band mask). They are checked against each other and against plain-Python scalar loops,
then the module's forward and the registered reference against them, the module's gradients (inputs and every
parameter) against autograd through the recurrent form, and the decoder (prefill, then one token at a time)
against the forward, with the counted state bytes after every call; then properties that follow from the math:
the feature map's dot product is 1 + s + s^2 / 2 (read through the module itself), the chunk size changes nothing,
a window covering the whole sequence is ordinary causal softmax attention, the output is causal, and large-norm
queries and keys in float32 still give finite outputs.
"""

import math

import pytest
import torch

import zoo
from zoo.decoding import counted_bytes

from paper_checks import make_inputs, close as _close, grads as _grads, causal_forward as _forward


NAME = "based"
D_MODEL = {1: 5, 2: 8, 3: 9}  # heads -> d_model: head sizes 5, 4 and 3
FORMS_TOL = 1e-12    # the two paper forms against each other (relative to the output scale)
FORWARD_TOL = 1e-11  # the module / the registered reference / the decoder against the paper forms (relative)
GRAD_TOL = 1e-10     # gradients (relative to each gradient's scale)
FLOAT32_TOL = 1e-4   # float32 forward / decode against the float64 forms (relative)


# --------------------------------------------------------------------------------------------------------------
# The independent float64 forms
# --------------------------------------------------------------------------------------------------------------

def _linear(x, layer):
    """x W^T (+ b), written out."""
    y = x @ layer.weight.transpose(0, 1)
    return y if layer.bias is None else y + layer.bias


def paper_inputs(module, query, key, value):
    """a, b (batch, n, H, F) and q, k, v (batch, n, H, d), per the paper's projections."""
    for t in (query, key, value):
        assert t.dtype == torch.float64
    heads = module.num_heads

    def split(x):  # head h: features [h w, (h + 1) w) of a width-(H w) projection
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)

    a = split(_linear(query, module.q_features))
    b = split(_linear(key, module.k_features))
    q = split(_linear(query, module.q_window))
    k = split(_linear(key, module.k_window))
    v = split(_linear(value, module.v_proj))
    assert a.shape[-1] == module.feature_dim and b.shape[-1] == module.feature_dim
    return a, b, q, k, v


def _finish(module, o):
    """Concatenate the heads in order, (batch, n, H, d) -> (batch, n, d_model), and apply the output projection."""
    batch, n, heads, d = o.shape
    return _linear(o.reshape(batch, n, heads * d), module.out_proj)


def feature_map(x):
    """phi(x) = [1, x / F^(1/4), vec(x x^T) / sqrt(2F)] over the last dimension (F features -> 1 + F + F^2)."""
    F = x.shape[-1]
    ones = torch.ones(x.shape[:-1] + (1,), dtype=x.dtype)
    outer = (x[..., :, None] * x[..., None, :]).reshape(x.shape[:-1] + (F * F,))
    return torch.cat([ones, x / F ** 0.25, outer / math.sqrt(2 * F)], -1)


def recurrent_branches(module, query, key, value):
    """The two branches, each (batch, n, H, d), token by token: the linear branch from running sums of the explicit
    feature map, the window branch from an explicit loop over the keys j = max(0, t - W) .. t."""
    a, b, q, k, v = paper_inputs(module, query, key, value)
    batch, n, heads, d = q.shape
    window = module.window
    width = 1 + a.shape[-1] + a.shape[-1] ** 2
    S = torch.zeros(batch, heads, width, d, dtype=torch.float64)   # sum_j phi(b_j) v_j^T
    z = torch.zeros(batch, heads, width, dtype=torch.float64)      # sum_j phi(b_j)
    linear, local = [], []
    for t in range(n):
        pb = feature_map(b[:, t])                                    # (batch, H, width)
        S = S + pb[..., :, None] * v[:, t, :, None, :]
        z = z + pb
        pa = feature_map(a[:, t])
        numerator = (pa[..., :, None] * S).sum(-2)                   # phi(a_t)^T S_t, (batch, H, d)
        denominator = (pa * z).sum(-1)                               # phi(a_t)^T z_t, (batch, H)
        linear.append(numerator / denominator[..., None])

        keys = range(max(0, t - window), t + 1)                      # 0 <= t - j <= W
        logits = [(q[:, t] * k[:, j]).sum(-1) / math.sqrt(d) for j in keys]   # (batch, H) each
        top = torch.stack(logits).amax(0).detach()                   # exact shift: cancels in the ratio
        weights = [torch.exp(logit - top) for logit in logits]
        total = sum(weights)
        local.append(sum(w[..., None] * v[:, j] for w, j in zip(weights, keys)) / total[..., None])
    if not n:
        empty = q.new_zeros(batch, 0, heads, d)
        return empty, empty
    return torch.stack(linear, 1), torch.stack(local, 1)


def recurrent_form(module, query, key, value):
    linear, local = recurrent_branches(module, query, key, value)
    return _finish(module, linear + local)


def taylor_branch(module, query, key, value):
    """The linear branch from the Taylor weights written out: w_ij = 1 + s_ij + s_ij^2 / 2 for j <= i, else 0."""
    a, b, _, _, v = paper_inputs(module, query, key, value)
    batch, n, heads, F = a.shape
    i_ = torch.arange(n).view(n, 1)
    j_ = torch.arange(n).view(1, n)
    s = (a[:, :, None, :, :] * b[:, None, :, :, :]).sum(-1) / math.sqrt(F)      # (batch, i, j, H)
    w = 1 + s + s * s / 2
    w = torch.where((j_ <= i_)[None, :, :, None], w, torch.zeros((), dtype=torch.float64))
    return (w[..., None] * v[:, None, :, :, :]).sum(2) / w.sum(2)[..., None]    # (batch, i, H, d)


def band_branch(module, query, key, value):
    """The window branch from an explicit band [0 <= i - j <= W]: softmax of q_i . k_j / sqrt(d) inside it."""
    _, _, q, k, v = paper_inputs(module, query, key, value)
    batch, n, heads, d = q.shape
    i_ = torch.arange(n).view(n, 1)
    j_ = torch.arange(n).view(1, n)
    band = ((i_ - j_ >= 0) & (i_ - j_ <= module.window))[None, :, :, None]      # (1, i, j, 1)
    logits = (q[:, :, None, :, :] * k[:, None, :, :, :]).sum(-1) / math.sqrt(d)  # (batch, i, j, H)
    logits = torch.where(band, logits, torch.full((), -math.inf, dtype=torch.float64))
    e = torch.exp(logits - logits.amax(2, keepdim=True).detach())
    e = torch.where(band, e, torch.zeros((), dtype=torch.float64))
    return (e[..., None] * v[:, None, :, :, :]).sum(2) / e.sum(2)[..., None]


def quadratic_form(module, query, key, value):
    batch, n = query.shape[:2]
    if not n:
        d = module.out_proj.in_features // module.num_heads
        return _finish(module, query.new_zeros(batch, 0, module.num_heads, d))
    return _finish(module, taylor_branch(module, query, key, value) + band_branch(module, query, key, value))


def paper_state_bytes(batch, context, d_model, heads, feature_dim, window, itemsize):
    """The contract's decoding state: the linear state (S and z: H (1 + F + F (F + 1) / 2) (d + 1) numbers per
    sequence, at least float32; the map's F^2 second-order features hold each unordered pair twice, x_a x_b and
    x_b x_a, and a state needs each once) plus the last min(t, W) window keys and values (2 min(t, W) d_model
    numbers, the input dtype)."""
    d = d_model // heads
    linear = heads * (1 + feature_dim + feature_dim * (feature_dim + 1) // 2) * (d + 1) * max(itemsize, 4)
    cache = 2 * min(context, window) * d_model * itemsize
    return batch * (linear + cache)


# --------------------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------------------

def make_module(registry, heads, seed, feature_dim=None, window=None, chunk=None, d_model=None, dtype=torch.float64):
    """A based module with every weight drawn from a seeded generator at scale 1/sqrt(fan_in) (so s_ij ~ N(0, 1)
    for unit-normal inputs: the Taylor weights differ well from exp's)."""
    torch.manual_seed(seed)
    d_model = d_model or D_MODEL[heads]
    options = {"feature_dim": feature_dim, "window": window, "chunk": chunk}
    options = {name: value for name, value in options.items() if value is not None}
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry, **options).to(torch.float64)
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for layer in (module.q_features, module.k_features, module.q_window, module.k_window, module.v_proj,
                      module.out_proj):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64)
                               / math.sqrt(layer.in_features))
    return module.to(dtype)


# --------------------------------------------------------------------------------------------------------------
# The forms themselves
# --------------------------------------------------------------------------------------------------------------

class _Holder(torch.nn.Module):
    """The contract's parameters and attributes with no zoo module behind them."""

    def __init__(self, heads, d_model, feature_dim, window):
        super().__init__()
        self.num_heads, self.feature_dim, self.window = heads, feature_dim, window
        for name, out_features in (("q_features", heads * feature_dim), ("k_features", heads * feature_dim),
                                   ("q_window", d_model), ("k_window", d_model), ("v_proj", d_model),
                                   ("out_proj", d_model)):
            setattr(self, name, torch.nn.Linear(d_model, out_features, bias=False).double())


def test_forms_equal_scalar_loops():
    """Both forms against plain-Python scalar loops over every index straight from the equations (batch 2, 2 heads
    of 3, F = 2, W = 2, n = 6: the window slides), with no zoo module involved."""
    g = torch.Generator().manual_seed(3)
    heads, d, F, W = 2, 3, 2, 2
    d_model = heads * d
    m = _Holder(heads, d_model, F, W)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.8 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    batch, n = 2, 6
    query, key, value = (torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        rec = recurrent_form(m, query, key, value)
        quad = quadratic_form(m, query, key, value)

    w = lambda layer, f, c: layer.weight[f, c].item()
    proj = lambda x, layer, f: sum(x[c] * w(layer, f, c) for c in range(layer.in_features))
    row = lambda x, b_, t: [x[b_, t, c].item() for c in range(d_model)]
    checked = 0
    for bi in range(batch):
        A = [[proj(row(query, bi, t), m.q_features, f) for f in range(heads * F)] for t in range(n)]
        B = [[proj(row(key, bi, t), m.k_features, f) for f in range(heads * F)] for t in range(n)]
        Q = [[proj(row(query, bi, t), m.q_window, f) for f in range(d_model)] for t in range(n)]
        K = [[proj(row(key, bi, t), m.k_window, f) for f in range(d_model)] for t in range(n)]
        V = [[proj(row(value, bi, t), m.v_proj, f) for f in range(d_model)] for t in range(n)]
        for i in range(n):
            o = [0.0] * d_model
            for h in range(heads):
                weights = []
                for j in range(i + 1):
                    s = sum(A[i][h * F + f] * B[j][h * F + f] for f in range(F)) / math.sqrt(F)
                    weights.append(1.0 + s + s * s / 2.0)
                logits = {j: sum(Q[i][h * d + e] * K[j][h * d + e] for e in range(d)) / math.sqrt(d)
                          for j in range(max(0, i - W), i + 1)}
                exps = {j: math.exp(logit) for j, logit in logits.items()}
                for e in range(d):
                    lin = sum(weights[j] * V[j][h * d + e] for j in range(i + 1)) / sum(weights)
                    win = sum(exps[j] * V[j][h * d + e] for j in exps) / sum(exps.values())
                    o[h * d + e] = lin + win
            for f in range(d_model):
                expected = sum(o[c] * w(m.out_proj, f, c) for c in range(d_model))
                assert abs(rec[bi, i, f].item() - expected) <= 1e-12, (bi, i, f, rec[bi, i, f].item(), expected)
                assert abs(quad[bi, i, f].item() - expected) <= 1e-12, (bi, i, f, quad[bi, i, f].item(), expected)
                checked += 1
    assert checked == batch * n * d_model


def test_feature_map_reproduces_the_taylor_weights():
    """phi(a) . phi(b) = 1 + s + s^2 / 2 with s = a . b / sqrt(F), for F = 1..5 and 16 (the helper the recurrent
    form uses, against the closed form), and the map has 1 + F + F^2 features."""
    g = torch.Generator().manual_seed(4)
    for F in (1, 2, 3, 4, 5, 16):
        a, b = (2 * torch.randn(50, F, generator=g, dtype=torch.float64) for _ in range(2))
        s = (a * b).sum(-1) / math.sqrt(F)
        assert feature_map(a).shape == (50, 1 + F + F * F)
        got = (feature_map(a) * feature_map(b)).sum(-1)
        _close(got, 1 + s + s * s / 2, 1e-13, f"phi(a).phi(b), F={F}")
        assert (got >= 0.5 - 1e-12).all()


FORM_CASES = [(batch, heads, n, F, W)
              for batch in (1, 2) for heads in (1, 2, 3) for n in (0, 1, 6, 13)
              for F, W in ((1, 1), (3, 2), (2, 5), (4, 3))]


@pytest.mark.parametrize("batch, heads, n, F, W", FORM_CASES)
def test_recurrent_and_quadratic_forms_agree(registry, batch, heads, n, F, W):
    seed = FORM_CASES.index((batch, heads, n, F, W))
    module = make_module(registry, heads, seed, feature_dim=F, window=W)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed, same=seed % 2 == 0)
    with torch.no_grad():
        rec = recurrent_form(module, query, key, value)
        quad = quadratic_form(module, query, key, value)
        lin, win = recurrent_branches(module, query, key, value)
    _close(quad, rec, FORMS_TOL, f"quadratic vs recurrent {(batch, heads, n, F, W)}")
    if n:
        _close(taylor_branch(module, query, key, value), lin, FORMS_TOL, "linear branch")
        _close(band_branch(module, query, key, value), win, FORMS_TOL, "window branch")
    if n == 13:  # the Taylor weights span negative and large s, where they differ from exp(s)
        a, b, _, _, _ = paper_inputs(module, query, key, value)
        s = (a[:, :, None] * b[:, None]).sum(-1) / math.sqrt(F)
        assert s.min() < -1 and s.max() > 1.5


# --------------------------------------------------------------------------------------------------------------
# The module against the forms
# --------------------------------------------------------------------------------------------------------------

def test_module_has_the_contract_parameters(registry):
    heads, d_model, F = 3, 9, 4
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry, feature_dim=F, window=5, chunk=7)
    assert (module.num_heads, module.feature_dim, module.window, module.chunk) == (heads, F, 5, 7)
    shapes = {"q_features": (heads * F, d_model), "k_features": (heads * F, d_model),
              "q_window": (d_model, d_model), "k_window": (d_model, d_model), "v_proj": (d_model, d_model),
              "out_proj": (d_model, d_model)}
    for name, (out_features, in_features) in shapes.items():
        layer = getattr(module, name)
        assert isinstance(layer, torch.nn.Linear), name
        assert (layer.out_features, layer.in_features, layer.bias) == (out_features, in_features, None), name
    assert {name for name, _ in module.named_parameters()} == {f"{n}.weight" for n in shapes}  # nothing else
    default = zoo.create(NAME, d_model=8, num_heads=2, registry=registry)
    assert (default.feature_dim, default.window, default.chunk) == (16, 64, 64)
    assert default.q_features.out_features == 2 * 16


def test_attn_mask_and_non_causal_are_refused(registry):
    module = make_module(registry, 2, 1, feature_dim=2, window=2)
    query, key, value = make_inputs(1, 4, 8, 1)
    with pytest.raises(Exception):
        module(query, key, value, attn_mask=torch.ones(4, 4, dtype=torch.bool).tril(), is_causal=True)
    with pytest.raises(Exception):
        module(query, key, value, attn_mask=None, is_causal=False)


_FS, _WS, _CHUNKS = (1, 2, 3, 4), (1, 2, 3, 5), (2, 3, 4, None)
CASES = [(batch, heads, n, _FS[i % 4], _WS[(i // 4 + i) % 4], _CHUNKS[(i // 2 + i // 8) % 4])
         for i, (batch, heads, n) in enumerate((batch, heads, n) for batch in (0, 1, 2) for heads in (1, 2, 3)
                                               for n in (0, 1, 4, 7, 13))]
CASES += [(1, 2, 70, None, None, None),  # the defaults F = 16, W = 64, chunk = 64: both spanned, partly filled
          (2, 2, 20, None, None, None),  # n < the default window and chunk
          (2, 1, 64, 2, 5, None),        # the default chunk filled exactly, many windows
          (1, 3, 40, 3, 3, 16),          # several chunks, a partial last one
          (2, 2, 33, 4, 5, 8),
          (1, 1, 17, 1, 2, 5)]


@pytest.mark.parametrize("batch, heads, n, F, W, chunk", CASES)
def test_forward_reference_and_gradients_match_the_paper(registry, batch, heads, n, F, W, chunk):
    seed = CASES.index((batch, heads, n, F, W, chunk))
    module = make_module(registry, heads, seed, feature_dim=F, window=W, chunk=chunk)
    assert module.feature_dim == (F or 16) and module.window == (W or 64) and module.chunk == (chunk or 64)
    d_model = D_MODEL[heads]
    same = seed % 3 == 0  # self-attention (one tensor) in a third of the cases
    query, key, value = make_inputs(batch, n, d_model, seed, same)
    case = dict(batch=batch, heads=heads, n=n, F=F, W=W, chunk=chunk, same=same, seed=seed)

    with torch.no_grad():
        rec = recurrent_form(module, query, key, value)
        quad = quadratic_form(module, query, key, value)
        out = _forward(module, query, key, value)
        registered = registry.variant(NAME).reference(module, query, key, value, attn_mask=None, is_causal=True)
    _close(quad, rec, FORMS_TOL, f"quadratic vs recurrent {case}")
    assert out.shape == (batch, n, d_model), case
    _close(out, rec, FORWARD_TOL, f"module forward vs recurrent form {case}")
    _close(out, quad, FORWARD_TOL, f"module forward vs quadratic form {case}")
    assert registered.shape == (batch, n, d_model), case
    _close(registered.double(), rec, FORWARD_TOL, f"registered reference vs recurrent form {case}")
    _close(registered.double(), quad, FORWARD_TOL, f"registered reference vs quadratic form {case}")

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
    assert len(names) == 6
    tensors = inputs + [params[p] for p in names]
    got = _grads(_forward(module, *call), cotangent, tensors)
    want = _grads(recurrent_form(module, *call), cotangent, tensors)
    for label, a, b in zip(labels + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label} {case}")
    if batch and n > 1:  # the check is not vacuous
        assert all(w.abs().max() > 1e-6 for w in want), case


def test_empty_sequence(registry):
    for batch in (0, 1, 2):
        for heads in (1, 3):
            module = make_module(registry, heads, 40 + batch, feature_dim=2, window=3, chunk=4)
            query, key, value = make_inputs(batch, 0, D_MODEL[heads], 40)
            with torch.no_grad():
                out = _forward(module, query, key, value)
            assert out.shape == (batch, 0, D_MODEL[heads]) and out.dtype == torch.float64, (batch, heads, out.shape)


# --------------------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("F, W, chunk", [(1, 1, None), (2, 3, 1), (3, 1, 2), (4, 2, None)])
def test_taylor_weight_read_through_the_module(registry, F, W, chunk):
    """The module's own pair weight is 1 + s + s^2 / 2. One head, d_model = 4, v_proj = out_proj = I, and the window
    branch made known: q_window = k_window = 0 gives uniform weights over the W + 1 (or fewer) keys, so with two
    tokens it is (v_0 + v_1) / 2 at token 1. Key 1 is zero (b_1 = 0: w_11 = 1), v_0 = e_0, v_1 = e_1, so the
    linear branch at token 1 is (w_10 e_0 + e_1) / (w_10 + 1) with w_10 = w(s), s = a_1 . b_0 / sqrt(F), swept over
    s in [-4, 6] (exp(s) and the map's other candidates differ there)."""
    d_model = 4
    module = make_module(registry, 1, 50 + F, feature_dim=F, window=W, chunk=chunk, d_model=d_model)
    eye = torch.eye(d_model, dtype=torch.float64)
    with torch.no_grad():
        module.q_window.weight.zero_()
        module.k_window.weight.zero_()
        module.v_proj.weight.copy_(eye)
        module.out_proj.weight.copy_(eye)
    g = torch.Generator().manual_seed(60 + F)
    query1 = torch.randn(d_model, generator=g, dtype=torch.float64)
    a1 = _linear(query1, module.q_features)
    direction = module.k_features.weight.detach().transpose(0, 1) @ a1   # b_0 along Wkf Wkf^T a_1: s > 0 per unit
    unit_s = (a1 * _linear(direction, module.k_features)).sum().item() / math.sqrt(F)   # s for key_0 = direction
    assert abs(unit_s) > 0.05
    targets = [-4.0, -2.0, -1.0, -0.5, 0.0, 0.3, 1.0, 2.5, 6.0]
    batch = len(targets)
    query = torch.zeros(batch, 2, d_model, dtype=torch.float64)
    key = torch.zeros(batch, 2, d_model, dtype=torch.float64)
    value = torch.zeros(batch, 2, d_model, dtype=torch.float64)
    query[:, 1] = query1
    query[:, 0] = torch.randn(d_model, generator=g, dtype=torch.float64)
    for i, s in enumerate(targets):
        key[i, 0] = direction * (s / unit_s)
    value[:, 0, 0] = 1.0
    value[:, 1, 1] = 1.0
    with torch.no_grad():
        out = _forward(module, query, key, value)
    s = torch.tensor(targets, dtype=torch.float64)
    w = 1 + s + s * s / 2
    uniform = torch.zeros(batch, 2, d_model, dtype=torch.float64)
    uniform[:, 0, 0] = 1.0                                            # token 0: one key, v_0
    uniform[:, 1, :2] = 0.5                                           # token 1: (v_0 + v_1) / 2
    linear = out - uniform
    expected = torch.zeros(batch, 2, d_model, dtype=torch.float64)
    expected[:, 0, 0] = 1.0                                           # token 0 sees only itself
    expected[:, 1, 0] = w / (w + 1)
    expected[:, 1, 1] = 1 / (w + 1)
    _close(linear, expected, FORWARD_TOL, f"linear branch with known weights (F={F}, W={W}, chunk={chunk})")
    _close(linear[:, 1, 0] / linear[:, 1, 1], w, FORWARD_TOL, "w_10 / w_11 = 1 + s + s^2 / 2")
    assert (w - torch.exp(s)).abs().max() > 1  # not exp's weights


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_chunk_size_changes_nothing(registry, heads):
    """The chunk is a schedule, not the math: every chunk size gives the same output (n = 13, F = 3, W = 4)."""
    n, batch = 13, 2
    outs = {}
    for chunk in (1, 2, 3, 4, 5, 8, 13, 16, 64):
        module = make_module(registry, heads, 7, feature_dim=3, window=4, chunk=chunk)  # the same parameters
        query, key, value = make_inputs(batch, n, D_MODEL[heads], 7)
        with torch.no_grad():
            outs[chunk] = _forward(module, query, key, value)
    with torch.no_grad():
        rec = recurrent_form(module, query, key, value)
    for chunk, out in outs.items():
        _close(out, rec, FORWARD_TOL, f"chunk={chunk} vs recurrent form (heads={heads})")
        _close(out, outs[64], FORWARD_TOL, f"chunk={chunk} vs chunk=64 (heads={heads})")


@pytest.mark.parametrize("heads, chunk", [(1, None), (2, 3), (3, 4)])
def test_a_window_covering_the_sequence_is_causal_softmax(registry, heads, chunk):
    """With W >= n - 1 every key j <= i is in the window: the window branch is ordinary causal softmax attention
    (torch's scaled_dot_product_attention, is_causal=True, scale 1/sqrt(d)); the module then equals that plus the
    Taylor branch. W = n - 2 drops key 0 for the last query, and the result differs."""
    batch, n = 2, 9
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 70 + heads)
    outs = {}
    for W in (n - 2, n - 1, n, 64, 100):
        module = make_module(registry, heads, 70 + heads, feature_dim=2, window=W, chunk=chunk)
        with torch.no_grad():
            outs[W] = _forward(module, query, key, value)
            _, _, q, k, v = paper_inputs(module, query, key, value)
            softmax = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
            expected = _finish(module, taylor_branch(module, query, key, value) + softmax)
        if W >= n - 1:
            _close(outs[W], expected, FORWARD_TOL, f"W={W} >= n - 1 vs causal softmax + Taylor (heads={heads})")
        else:
            assert (outs[W][:, -1] - expected[:, -1]).abs().max() > 1e-6
            _close(outs[W][:, :-1], expected[:, :-1], FORWARD_TOL, f"W={W}: the first n - 1 tokens see all keys")


@pytest.mark.parametrize("F, W, chunk", [(2, 3, None), (3, 1, 2), (1, 5, 4)])
def test_output_is_causal(registry, F, W, chunk):
    """Changing query, key and value from token t on leaves the outputs before t exactly as they were."""
    heads, batch, n = 2, 2, 11
    module = make_module(registry, heads, 11, feature_dim=F, window=W, chunk=chunk)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 11)
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        base = _forward(module, query, key, value)
        for t in (0, 1, 4, 6, 10):
            moved = [x.clone() for x in (query, key, value)]
            for x in moved:
                x[:, t:] += torch.randn(x[:, t:].shape, generator=g, dtype=torch.float64)
            out = _forward(module, *moved)
            _close(out[:, :t], base[:, :t], 1e-13, f"outputs before t={t} after changing tokens >= t")
            assert (out[:, t] - base[:, t]).abs().max() > 1e-6  # and token t itself does move


@pytest.mark.parametrize("scale", [1e2, 1e3, 3e4])
@pytest.mark.parametrize("F, W, chunk", [(3, 2, 4), (None, None, None)])
def test_large_norm_queries_and_keys_stay_finite_in_float32(registry, scale, F, W, chunk):
    """Queries and keys of norm ~scale in float32 (Taylor weights up to ~scale^4, window logits ~scale^2): the
    output and the gradients are finite. Both branches average the values with non-negative weights, so the
    output (with out_proj = I) stays within twice the largest value magnitude seen; checked with a float32 slack."""
    heads, batch, n = 2, 2, 13
    module = make_module(registry, heads, 80, feature_dim=F, window=W, chunk=chunk, dtype=torch.float32)
    with torch.no_grad():
        module.out_proj.weight.copy_(torch.eye(D_MODEL[heads]))
    q0, k0, v0 = make_inputs(batch, n, D_MODEL[heads], 80)
    query = (scale * q0).float().requires_grad_(True)
    key = (scale * k0).float().requires_grad_(True)
    value = v0.float().requires_grad_(True)
    out = _forward(module, query, key, value)
    assert out.dtype == torch.float32 and torch.isfinite(out).all(), (scale, F, W)
    v = value.detach().double() @ module.v_proj.weight.detach().double().transpose(0, 1)
    bound = 2 * v.abs().cummax(1).values                                  # max_{j <= i} |v_j|, per feature
    assert (out.detach().double().abs() <= bound * (1 + 1e-3) + 1e-5).all(), (scale, F, W)
    out.backward(torch.ones_like(out))
    for name, t in (("query", query), ("key", key), ("value", value), *module.named_parameters()):
        assert torch.isfinite(t.grad).all(), (name, scale, F, W)


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


DECODE_CASES = [(2, 9, 2, 3, 2), (3, 7, 3, 2, None), (1, 5, 4, 1, 3), (2, 13, 1, 5, 4), (2, 131, None, None, None)]


def _declared(dec, module, batch, context, itemsize):
    return dec.state_bytes(batch, context, module.out_proj.in_features, module.num_heads, itemsize,
                           feature_dim=module.feature_dim, window=module.window)


@pytest.mark.parametrize("heads, n, F, W, chunk", DECODE_CASES)
def test_decoder_matches_the_forward(registry, heads, n, F, W, chunk):
    """Prefill of p tokens then single-token steps equals the forward and the paper forms for p in
    {0, 1, n//2, n-1, n}, batch 2, with n > 2W (the window cache wraps); the counted state bytes after every call
    equal the declared state_bytes."""
    batch = 2
    d_model = D_MODEL[heads]
    seed = 600 + heads * 10 + n
    module = make_module(registry, heads, seed, feature_dim=F, window=W, chunk=chunk)
    assert n > 2 * module.window
    dec = registry.variant(NAME).decoder
    assert dec is not None and dec.state_bytes is not None
    query, key, value = make_inputs(batch, n, d_model, seed)
    with torch.no_grad():
        forward = _forward(module, query, key, value)
        quad = quadratic_form(module, query, key, value)
        rec = recurrent_form(module, query, key, value) if n < 20 else quad
    _close(forward, quad, FORWARD_TOL, "forward vs quadratic form")
    _close(rec, quad, FORMS_TOL, "recurrent vs quadratic form")

    def bytes_ok(t, state):
        counted = counted_bytes(state)
        declared = _declared(dec, module, batch, t, 8)
        assert counted == declared, f"after {t} tokens: counted {counted} bytes, declared state_bytes {declared}"

    for prefill in sorted({0, 1, n // 2, n - 1, n}):
        case = dict(heads=heads, n=n, F=F, W=W, chunk=chunk, prefill=prefill)
        with torch.no_grad():
            decoded = _decode(dec, module, query, key, value, prefill, bytes_ok)
        _close(decoded, forward, FORWARD_TOL, f"decode vs forward {case}")
        _close(decoded, quad, FORWARD_TOL, f"decode vs quadratic form {case}")
        _close(decoded, rec, FORWARD_TOL, f"decode vs recurrent form {case}")


@pytest.mark.parametrize("heads, n, F, W, chunk", DECODE_CASES[:2] + DECODE_CASES[3:4])
def test_decoder_in_float32(registry, heads, n, F, W, chunk):
    """The same decode in float32: close to the float64 forms and to the float32 forward; the counted state bytes
    after every call equal the declared state_bytes for itemsize 4."""
    batch = 2
    d_model = D_MODEL[heads]
    seed = 700 + heads * 10 + n
    module64 = make_module(registry, heads, seed, feature_dim=F, window=W, chunk=chunk)
    module = make_module(registry, heads, seed, feature_dim=F, window=W, chunk=chunk, dtype=torch.float32)
    dec = registry.variant(NAME).decoder
    query, key, value = make_inputs(batch, n, d_model, seed)
    with torch.no_grad():
        rec = recurrent_form(module64, query, key, value)
        q32, k32, v32 = (x.float() for x in (query, key, value))
        forward = _forward(module, q32, k32, v32)
    _close(forward, rec, FLOAT32_TOL, "float32 forward vs float64 recurrent form", dtype=torch.float32)

    def bytes_ok(t, state):
        counted = counted_bytes(state)
        declared = _declared(dec, module, batch, t, 4)
        assert counted == declared, f"float32, after {t} tokens: counted {counted}, declared {declared}"
        assert all(torch.isfinite(x).all() for x in state.values() if isinstance(x, torch.Tensor)), t

    for prefill in sorted({0, 1, n // 2, n - 1, n}):
        case = dict(heads=heads, n=n, F=F, W=W, chunk=chunk, prefill=prefill)
        with torch.no_grad():
            decoded = _decode(dec, module, q32, k32, v32, prefill, bytes_ok)
        _close(decoded, rec, FLOAT32_TOL, f"float32 decode vs float64 recurrent form {case}", dtype=torch.float32)
        _close(decoded, forward, FLOAT32_TOL, f"float32 decode vs float32 forward {case}", dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, F, W", [(2, 2, 3), (3, 3, 2), (1, 4, 1), (2, None, None)])
def test_decoder_state_bytes_follow_the_contract_formula(registry, dtype, heads, F, W):
    """After t tokens the state holds the linear state, H (1 + F + F (F + 1) / 2) (d + 1) numbers per sequence (S:
    the distinct features times d values, z: their sums), kept at least in float32, plus
    the last min(t, W) window keys and values, 2 min(t, W) d_model numbers per sequence in the input dtype. The
    counted bytes after a prefill of 0, 1 and 2 tokens and after every step up to t = 2W + 3 (the cache full and
    wrapping), and the declared state_bytes, both equal it."""
    batch = 2
    d_model = D_MODEL[heads]
    module = make_module(registry, heads, 800 + heads, feature_dim=F, window=W, dtype=dtype)
    dec = registry.variant(NAME).decoder
    n = 2 * module.window + 3
    query, key, value = (x.to(dtype) for x in make_inputs(batch, n, d_model, 800 + heads))
    itemsize = query.element_size()
    seen = []

    def bytes_ok(t, state):
        formula = paper_state_bytes(batch, t, d_model, heads, module.feature_dim, module.window, itemsize)
        seen.append(t)
        counted = counted_bytes(state)
        cache = batch * 2 * min(t, module.window) * d_model * itemsize
        per_feature = batch * heads * (d_model // heads + 1) * max(itemsize, 4)
        assert counted == formula, (
            f"{dtype}, after {t} tokens: counted {counted} bytes, the contract's formula {formula} (beside the stated "
            f"window cache the counted bytes hold {(counted - cache) / per_feature:g} linear-state features per head; "
            f"the distinct features number 1 + F + F (F + 1) / 2 = "
            f"{1 + module.feature_dim + module.feature_dim * (module.feature_dim + 1) // 2})")
        declared = _declared(dec, module, batch, t, itemsize)
        assert declared == formula, f"{dtype}, {t} tokens: declared state_bytes {declared}, formula {formula}"

    with torch.no_grad():
        for prefill in (0, 1, 2):
            _decode(dec, module, query, key, value, prefill, bytes_ok)
    assert seen[-1] == n and set(seen) == set(range(n + 1))


def test_decoder_prefill_of_nothing(registry):
    """A prefill of no tokens returns an empty output; its state already holds the (zero) linear state and no
    window entries, as declared."""
    heads, batch = 2, 2
    module = make_module(registry, heads, 77, feature_dim=3, window=2)
    query, key, value = make_inputs(batch, 0, D_MODEL[heads], 77)
    dec = registry.variant(NAME).decoder
    with torch.no_grad():
        out, state = dec.prefill(module, query, key, value)
    assert out.shape == (batch, 0, D_MODEL[heads])
    assert counted_bytes(state) == _declared(dec, module, batch, 0, 8)
    for x in state.values():
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            assert (x == 0).all()
