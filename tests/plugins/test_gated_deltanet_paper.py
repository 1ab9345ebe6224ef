"""An independent check of the "gated-deltanet" variant (Gated DeltaNet, Yang, Kautz & Hatamizadeh, ICLR 2025: the
attention core with a per-head output norm), written from the paper's equations and the calling contract only, not
from the fast path.

With H heads of d = d_model / H features (head h = features [h d, (h + 1) d)), SiLU(z) = z sigmoid(z):

    q_t = L2norm(SiLU(query_t Wq^T))     k_t = L2norm(SiLU(key_t Wk^T))     v_t = SiLU(value_t Wv^T)   (per head)
    beta_t,h = sigmoid(key_t Wb^T)_h                                          (writing strength)
    alpha_t,h = exp(-exp(A_log_h) softplus((key_t Wa^T)_h + dt_bias_h))       (decay)
    S_0 = 0,   S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T   (d_k x d_v, per head)
    o_t,h = RMSNorm(S_t^T q_t / sqrt(d)),     heads concatenated in order,     output = o Wo^T

(the paper writes the transpose: S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t).

Two float64 forms of that are written here, independently of each other: the token-by-token recurrence (a Python
loop over t with explicit I - beta k k^T matrices) and the unrolled closed form

    o_t = sum_{s<=t} exp(sum_{s<l<=t} log alpha_l) beta_s (q_t^T P(t, s) k_s) v_s / sqrt(d),
    P(t, s) = (I - beta_t k_t k_t^T) (I - beta_{t-1} k_{t-1} k_{t-1}^T) ... (I - beta_{s+1} k_{s+1} k_{s+1}^T)

with the decay's segment sums taken over an explicit indicator [s < l <= t] (no cumsum differences) and each
P(t, s) multiplied out from scratch for each t. They are checked against each other and against plain-Python scalar
loops of the delta rule in its "new value" form (u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t), S_t = alpha_t S_{t-1}
+ k_t u_t^T); then the module's forward and the registered reference against them, the module's gradients against
autograd through the recurrence, and the decoder (prefill, then one token at a time) against the forward; then
properties that follow from the math: the chunk size changes nothing, the output is causal, the gates read the key
input, writing a unit key with beta = 1 overwrites what it held (the delta rule), with beta = 1/2 and a known decay
two writes of one key leave exactly alpha beta (1 - beta) v1 + beta v2, and a strong decay (segment sums below
-709, or a single token's below it) still gives finite outputs and gradients equal to the recurrence.
"""

import math

import pytest
import torch

import zoo

from paper_checks import make_inputs, close as _close, grads as _grads, causal_forward as _forward


NAME = "gated-deltanet"
D_MODEL = {1: 5, 2: 8, 3: 9}  # heads -> d_model: head sizes 5, 4 and 3
FORMS_TOL = 1e-12    # the two paper forms against each other (relative to the output scale)
FORWARD_TOL = 1e-11  # the module / the registered reference / the decoder against the paper forms (relative)
GRAD_TOL = 1e-10     # gradients (relative to each gradient's scale)
FLOAT32_TOL = 1e-4   # a float32 decode against the float64 forms (relative)
OVERFLOW = math.log(torch.finfo(torch.float64).max)  # ~709.8: exp of more than this is inf in float64


# --------------------------------------------------------------------------------------------------------------
# The independent float64 forms
# --------------------------------------------------------------------------------------------------------------

def _linear(x, layer):
    """x W^T (+ b), written out."""
    y = x @ layer.weight.transpose(0, 1)
    return y if layer.bias is None else y + layer.bias


def _silu(z):
    return z * torch.sigmoid(z)


def _softplus(z):
    """log(1 + exp(z)) exactly (no threshold above which it returns z)."""
    return torch.logaddexp(z, torch.zeros((), dtype=z.dtype))


def _l2normalize(x):
    """x / ||x||_2 over the last dimension (one head's features)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True))


def paper_inputs(module, query, key, value):
    """q, k, v (b, n, H, d), beta (b, n, H) and log alpha (b, n, H), per the paper's projections and gates (both
    gates read from the key input)."""
    for t in (query, key, value):
        assert t.dtype == torch.float64
    heads = module.num_heads

    def split(x):  # head h: features [h d, (h + 1) d)
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)

    q = _l2normalize(split(_silu(_linear(query, module.q_proj))))
    k = _l2normalize(split(_silu(_linear(key, module.k_proj))))
    v = split(_silu(_linear(value, module.v_proj)))
    beta = torch.sigmoid(_linear(key, module.b_proj))
    log_alpha = -torch.exp(module.A_log) * _softplus(_linear(key, module.a_proj) + module.dt_bias)
    return q, k, v, beta, log_alpha


def _finish(module, o):
    """Normalise each head's output by its root mean square (no affine weight, the module's eps), concatenate the
    heads in order (b, n, H, d) -> (b, n, d_model) and apply the output projection."""
    batch, n, heads, d = o.shape
    o = o / torch.sqrt((o * o).sum(-1, keepdim=True) / d + module.eps)
    return _linear(o.reshape(batch, n, heads * d), module.out_proj)


def recurrence_form(module, query, key, value, return_state=False):
    """The token-by-token recurrence: S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,
    o_t = S_t^T q_t / sqrt(d). ``return_state``: also the final S (b, H, d_k, d_v)."""
    q, k, v, beta, log_alpha = paper_inputs(module, query, key, value)
    batch, n, heads, d = q.shape
    eye = torch.eye(d, dtype=torch.float64)
    S = torch.zeros(batch, heads, d, d, dtype=torch.float64)                  # S_0 = 0 (key feature i, value feature j)
    outs = []
    for t in range(n):
        kt, vt, qt = k[:, t], v[:, t], q[:, t]                                  # (b, H, d)
        b_ = beta[:, t, :, None, None]                                          # (b, H, 1, 1)
        a_ = torch.exp(log_alpha[:, t])[:, :, None, None]
        kkT = kt[..., :, None] * kt[..., None, :]                              # (b, H, d, d): k k^T
        transition = a_ * (eye - b_ * kkT)                                      # alpha (I - beta k k^T)
        S = transition @ S + b_ * (kt[..., :, None] * vt[..., None, :])        # + beta k v^T
        outs.append((S * qt[..., :, None]).sum(-2) / math.sqrt(d))             # S^T q: sum over key features
    o = torch.stack(outs, 1) if outs else q.new_zeros(batch, 0, heads, d)
    out = _finish(module, o)
    return (out, S) if return_state else out


def unrolled_form(module, query, key, value):
    """The closed form of the recurrence, S_t = sum_{s<=t} (prod_{l=t..s+1} alpha_l (I - beta_l k_l k_l^T))
    beta_s k_s v_s^T, read with q_t: the scalar decays exp(sum_{s<l<=t} log alpha_l) from an explicit indicator,
    the matrix products P(t, s) = P(t, s + 1) (I - beta_{s+1} k_{s+1} k_{s+1}^T) from P(t, t) = I, afresh for each t."""
    q, k, v, beta, log_alpha = paper_inputs(module, query, key, value)
    batch, n, heads, d = q.shape
    eye = torch.eye(d, dtype=torch.float64)
    t_ = torch.arange(n).view(n, 1, 1)
    s_ = torch.arange(n).view(1, n, 1)
    l_ = torch.arange(n).view(1, 1, n)
    between = ((s_ < l_) & (l_ <= t_)).to(torch.float64)                        # (t, s, l)
    # segment[b, t, s, h] = sum_l [s < l <= t] log alpha[b, l, h]
    segment = (between[None, :, :, :, None] * log_alpha[:, None, None, :, :]).sum(3)
    householder = eye - beta[..., None, None] * (k[..., :, None] * k[..., None, :])  # (b, n, H, d, d)
    outs = []
    for t in range(n):
        P = eye.expand(batch, heads, d, d)                                      # P(t, t) = I
        o = torch.zeros(batch, heads, d, dtype=torch.float64)
        for s in range(t, -1, -1):
            if s < t:
                P = P @ householder[:, s + 1]                                   # P(t, s) = P(t, s + 1) H_{s+1}
            weight = (q[:, t, :, :, None] * P * k[:, s, :, None, :]).sum((-2, -1))   # q_t^T P(t, s) k_s, (b, H)
            weight = weight * beta[:, s] * torch.exp(segment[:, t, s])
            o = o + weight[..., None] * v[:, s]
        outs.append(o / math.sqrt(d))
    o = torch.stack(outs, 1) if outs else q.new_zeros(batch, 0, heads, d)
    return _finish(module, o)


# --------------------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------------------

def make_module(registry, heads, seed, chunk=None, a_log=(0.0, 0.5), dt_bias=(-1.0, 0.5), d_model=None,
                dtype=torch.float64):
    """A gated-deltanet module with every parameter drawn from a seeded generator: weights of scale
    1/sqrt(fan_in) (b_proj: 2/sqrt(fan_in), so beta spreads over (0, 1)), A_log ~ normal(a_log),
    dt_bias ~ normal(dt_bias)."""
    torch.manual_seed(seed)
    d_model = d_model or D_MODEL[heads]
    options = {} if chunk is None else {"chunk": chunk}
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry, **options).to(torch.float64)
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for layer in (module.q_proj, module.k_proj, module.v_proj, module.out_proj, module.b_proj, module.a_proj):
            scale = 2.0 if layer is module.b_proj else 1.0
            layer.weight.copy_(scale * torch.randn(layer.weight.shape, generator=g, dtype=torch.float64)
                               / math.sqrt(layer.in_features))
        module.A_log.copy_(a_log[0] + a_log[1] * torch.randn(heads, generator=g, dtype=torch.float64))
        module.dt_bias.copy_(dt_bias[0] + dt_bias[1] * torch.randn(heads, generator=g, dtype=torch.float64))
    return module.to(dtype)


# --------------------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------------------

class _Holder(torch.nn.Module):
    """The contract's parameters with no zoo module behind them."""

    def __init__(self, heads, d_model):
        super().__init__()
        self.num_heads, self.eps = heads, 1e-5
        for name, out_features in (("q_proj", d_model), ("k_proj", d_model), ("v_proj", d_model),
                                   ("out_proj", d_model), ("b_proj", heads), ("a_proj", heads)):
            setattr(self, name, torch.nn.Linear(d_model, out_features, bias=False).double())
        self.A_log = torch.nn.Parameter(torch.zeros(heads, dtype=torch.float64))
        self.dt_bias = torch.nn.Parameter(torch.zeros(heads, dtype=torch.float64))


def test_recurrence_and_unrolled_forms_equal_scalar_loops():
    """Both forms, against plain-Python scalar loops over every index of the delta rule in its "new value" form
    u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t), S_t = alpha_t S_{t-1} + k_t u_t^T (batch 2, 2 heads of 3, n = 5),
    with no zoo module involved."""
    g = torch.Generator().manual_seed(3)
    heads, d = 2, 3
    d_model = heads * d
    m = _Holder(heads, d_model)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.8 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    batch, n = 2, 5
    q, k, v = (torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        rec = recurrence_form(m, q, k, v)
        unr = unrolled_form(m, q, k, v)

    w = lambda layer, f, c: layer.weight[f, c].item()
    proj = lambda x, layer, f: sum(x[c] * w(layer, f, c) for c in range(layer.in_features))
    row = lambda x, b, t: [x[b, t, c].item() for c in range(d_model)]
    silu = lambda z: z / (1.0 + math.exp(-z))
    sigmoid = lambda z: 1.0 / (1.0 + math.exp(-z))
    checked = 0
    for b in range(batch):
        S = [[[0.0] * d for _ in range(d)] for _ in range(heads)]  # S[h][i][j]: key feature i, value feature j
        for t in range(n):
            qt = [silu(proj(row(q, b, t), m.q_proj, f)) for f in range(d_model)]
            kt = [silu(proj(row(k, b, t), m.k_proj, f)) for f in range(d_model)]
            vt = [silu(proj(row(v, b, t), m.v_proj, f)) for f in range(d_model)]
            o = [0.0] * d_model
            for h in range(heads):
                qn = math.sqrt(sum(qt[h * d + i] ** 2 for i in range(d)))
                kn = math.sqrt(sum(kt[h * d + i] ** 2 for i in range(d)))
                qh = [qt[h * d + i] / qn for i in range(d)]
                kh = [kt[h * d + i] / kn for i in range(d)]
                vh = [vt[h * d + j] for j in range(d)]
                beta = sigmoid(proj(row(k, b, t), m.b_proj, h))
                z = proj(row(k, b, t), m.a_proj, h) + m.dt_bias[h].item()
                alpha = math.exp(-math.exp(m.A_log[h].item()) * math.log1p(math.exp(z)))
                u = [beta * (vh[j] - alpha * sum(S[h][i][j] * kh[i] for i in range(d))) for j in range(d)]
                for i in range(d):
                    for j in range(d):
                        S[h][i][j] = alpha * S[h][i][j] + kh[i] * u[j]
                for j in range(d):
                    o[h * d + j] = sum(S[h][i][j] * qh[i] for i in range(d)) / math.sqrt(d)
                rms = math.sqrt(sum(o[h * d + j] ** 2 for j in range(d)) / d + m.eps)
                for j in range(d):
                    o[h * d + j] /= rms
            for f in range(d_model):
                expected = sum(o[c] * w(m.out_proj, f, c) for c in range(d_model))
                assert abs(rec[b, t, f].item() - expected) <= 1e-12, (b, t, f, rec[b, t, f].item(), expected)
                assert abs(unr[b, t, f].item() - expected) <= 1e-12, (b, t, f, unr[b, t, f].item(), expected)
                checked += 1
    assert checked == batch * n * d_model


def test_module_has_the_contract_parameters(registry):
    heads, d_model = 3, 9
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry)
    assert module.num_heads == heads and module.chunk == 64 and isinstance(module.eps, float)
    assert zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry, chunk=5).chunk == 5
    shapes = {"q_proj": (d_model, d_model), "k_proj": (d_model, d_model), "v_proj": (d_model, d_model),
              "out_proj": (d_model, d_model), "b_proj": (heads, d_model), "a_proj": (heads, d_model)}
    for name, (out_features, in_features) in shapes.items():
        layer = getattr(module, name)
        assert isinstance(layer, torch.nn.Linear), name
        assert (layer.out_features, layer.in_features, layer.bias) == (out_features, in_features, None), name
    for name in ("A_log", "dt_bias"):
        assert isinstance(getattr(module, name), torch.nn.Parameter) and getattr(module, name).shape == (heads,), name
    expected = {f"{n}.weight" for n in shapes} | {"A_log", "dt_bias"}
    assert {name for name, _ in module.named_parameters()} == expected  # no affine norm weight, nothing else


def test_attn_mask_is_refused(registry):
    module = make_module(registry, 2, 1)
    query, key, value = make_inputs(1, 4, 8, 1)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    with pytest.raises(Exception):
        module(query, key, value, attn_mask=mask, is_causal=True)


FORM_CASES = [(batch, heads, n, same)
              for batch in (1, 2) for heads in (1, 2, 3) for n in (0, 1, 5, 13) for same in (False, True)]


@pytest.mark.parametrize("batch, heads, n, same", FORM_CASES)
def test_recurrence_and_unrolled_forms_agree(registry, batch, heads, n, same):
    seed = FORM_CASES.index((batch, heads, n, same))
    module = make_module(registry, heads, seed)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed, same)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        unr = unrolled_form(module, query, key, value)
    _close(unr, rec, FORMS_TOL, f"unrolled vs recurrence {(batch, heads, n, same)}")
    if n > 4:  # the gates are real: the decay well inside (0, 1) and beta spread over (0, 1)
        _, _, _, beta, log_alpha = paper_inputs(module, query, key, value)
        alpha = torch.exp(log_alpha)
        assert alpha.max() < 1 - 1e-3 and alpha.mean() < 0.9 and alpha.min() > 1e-3
        assert beta.max() - beta.min() > 0.3


CASES = [(batch, heads, n, chunk)
         for batch in (0, 1, 2)
         for heads in (1, 2, 3)
         for n in (0, 1, 5, 7, 13)
         for chunk in (2, 3, 4, None)]
CASES += [(1, 2, 70, None), (2, 1, 64, None), (1, 3, 40, 16), (2, 2, 33, 8)]  # the default chunk (64) spanned,
# filled exactly, and several larger chunks with a partial last one


@pytest.mark.parametrize("batch, heads, n, chunk", CASES)
def test_forward_reference_and_gradients_match_the_paper(registry, batch, heads, n, chunk):
    seed = CASES.index((batch, heads, n, chunk))
    module = make_module(registry, heads, seed, chunk=chunk)
    d_model = D_MODEL[heads]
    same = seed % 3 == 0  # self-attention (one tensor) in a third of the cases
    query, key, value = make_inputs(batch, n, d_model, seed, same)
    case = dict(batch=batch, heads=heads, n=n, chunk=chunk, same=same, seed=seed)

    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        unr = unrolled_form(module, query, key, value)
        out = _forward(module, query, key, value)
        registered = registry.variant(NAME).reference(module, query, key, value, attn_mask=None, is_causal=True)
    _close(unr, rec, FORMS_TOL, f"unrolled vs recurrence {case}")
    assert out.shape == (batch, n, d_model), case
    _close(out, rec, FORWARD_TOL, f"module forward vs recurrence {case}")
    _close(out, unr, FORWARD_TOL, f"module forward vs unrolled form {case}")
    _close(registered.double(), rec, FORWARD_TOL, f"registered reference vs recurrence {case}")
    _close(registered.double(), unr, FORWARD_TOL, f"registered reference vs unrolled form {case}")

    # gradients: query, key, value, the gate parameters first, then every other parameter, for a random cotangent
    g = torch.Generator().manual_seed(40_000 + seed)
    cotangent = torch.randn(batch, n, d_model, generator=g, dtype=torch.float64)
    if same:
        x = query.clone().requires_grad_(True)
        inputs, labels = [x], ["x (query = key = value)"]
        call = (x, x, x)
    else:
        inputs = [t.clone().requires_grad_(True) for t in (query, key, value)]
        labels, call = ["query", "key", "value"], inputs
    params = dict(module.named_parameters())
    first = ["A_log", "dt_bias", "b_proj.weight", "a_proj.weight"]
    names = first + sorted(set(params) - set(first))
    tensors = inputs + [params[p] for p in names]
    got = _grads(_forward(module, *call), cotangent, tensors)
    want = _grads(recurrence_form(module, *call), cotangent, tensors)
    for label, a, b in zip(labels + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label} {case}")


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_chunk_size_changes_nothing(registry, heads):
    """The chunk is a schedule, not the math: every chunk size gives the same output (n = 13, a partial chunk
    for 2, 3, 4, 5 and 8; one chunk for 13, 16 and 64)."""
    n, batch = 13, 2
    outs = {}
    for chunk in (1, 2, 3, 4, 5, 8, 13, 16, 64):
        module = make_module(registry, heads, 7, chunk=chunk)  # the same seed: the same parameters
        query, key, value = make_inputs(batch, n, D_MODEL[heads], 7)
        with torch.no_grad():
            outs[chunk] = _forward(module, query, key, value)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
    for chunk, out in outs.items():
        _close(out, rec, FORWARD_TOL, f"chunk={chunk} vs recurrence (heads={heads})")
        _close(out, outs[64], FORWARD_TOL, f"chunk={chunk} vs chunk=64 (heads={heads})")


@pytest.mark.parametrize("chunk", [2, 3, None])
def test_output_is_causal(registry, chunk):
    """Changing query, key and value from token t on leaves the outputs before t exactly as they were."""
    heads, batch, n = 2, 2, 11
    module = make_module(registry, heads, 11, chunk=chunk)
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


def test_gates_read_the_key_input(registry):
    """beta and alpha come from the tensor passed as key: with query and key swapped the module still matches the
    recurrence (which takes both gates from whatever is passed as key), and the two calls differ."""
    heads, batch, n = 2, 2, 7
    module = make_module(registry, heads, 21, chunk=3)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 21)
    with torch.no_grad():
        out = _forward(module, query, key, value)
        swapped = _forward(module, key, query, value)
        _close(out, recurrence_form(module, query, key, value), FORWARD_TOL, "query, key")
        _close(swapped, recurrence_form(module, key, query, value), FORWARD_TOL, "query and key swapped")
        # with Wq = Wk the two calls differ only through the gates, which must then follow the key
        module.q_proj.weight.copy_(module.k_proj.weight)
        a, b = _forward(module, query, key, value), _forward(module, key, query, value)
        _close(b, recurrence_form(module, key, query, value), FORWARD_TOL, "Wq = Wk, query and key swapped")
        assert (a - b).abs().max() > 1e-3


def _rms(o, eps):
    """Per-head RMS norm of o (b, H, d)."""
    return o / torch.sqrt((o * o).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("beta_one, a_log, dt_bias", [(True, -60.0, 0.3), (True, 0.2, -0.4), (False, -60.0, 0.3),
                                                      (False, -0.5, 0.3), (False, 0.7, 1.1)])
@pytest.mark.parametrize("chunk", [1, 2, None])
def test_two_writes_of_one_key(registry, beta_one, a_log, dt_bias, chunk):
    """The delta rule on the module itself, with out_proj = I and Wq = Wk so that a query equal to a key reads
    S^T k. Token 1 writes the same key as token 0; the query at token 1 is that key.

    beta = 1 (a constant key feature 10 and b_proj reading only it: sigmoid(100) = 1 in float64): the second write
    overwrites the first whatever the decay, S_1^T k = v_1, so o_1 = v_1 / sqrt(d) (alpha = 1 for A_log = -60:
    exp(-60) softplus(.) ~ 1e-26). beta = 1/2 (b_proj = 0), a_proj = 0: alpha = exp(-exp(A_log) softplus(dt_bias))
    is known, S_1^T k = alpha beta (1 - beta) v_0 + beta v_1 exactly. Later tokens (2..4) write other keys, and
    token 5 writes the key of tokens 0 and 1 again and reads it back: with beta = 1 that gives v_5 however much the
    keys written between overlap it."""
    heads, batch, n = 2, 2, 6
    d_model = D_MODEL[heads]
    d = d_model // heads
    module = make_module(registry, heads, 31, chunk=chunk)
    query, key, value = make_inputs(batch, n, d_model, 31)
    with torch.no_grad():
        module.out_proj.weight.copy_(torch.eye(d_model, dtype=torch.float64))
        module.q_proj.weight.copy_(module.k_proj.weight)
        module.A_log.fill_(a_log)
        module.dt_bias.fill_(dt_bias)
        module.a_proj.weight.zero_()
        module.b_proj.weight.zero_()
        if beta_one:
            key[..., 0] = 10.0
            module.b_proj.weight[:, 0] = 10.0
        key[:, 1] = key[:, 0]
        key[:, 5] = key[:, 0]
        query[:, 1] = key[:, 1]
        query[:, 5] = key[:, 5]
        out = _forward(module, query, key, value)
        rec = recurrence_form(module, query, key, value)
        _, _, v, beta, log_alpha = paper_inputs(module, query, key, value)
    _close(out, rec, FORWARD_TOL, "module vs recurrence")
    assert (beta == (1.0 if beta_one else 0.5)).all()
    alpha = math.exp(-math.exp(a_log) * math.log1p(math.exp(dt_bias)))
    assert torch.allclose(torch.exp(log_alpha), torch.full_like(log_alpha, alpha), rtol=1e-15, atol=0)
    if a_log == -60.0:
        assert alpha == 1.0
    b = 1.0 if beta_one else 0.5
    read = alpha * b * (1 - b) * v[:, 0] + b * v[:, 1]                                    # S_1^T k, (batch, H, d)
    expected = _rms(read / math.sqrt(d), module.eps).reshape(batch, d_model)
    _close(out[:, 1], expected, FORWARD_TOL, f"token 1 reads {b} (1 - {b}) alpha v_0 + {b} v_1")
    if beta_one:
        expected = _rms(v[:, 5] / math.sqrt(d), module.eps).reshape(batch, d_model)
        _close(out[:, 5], expected, FORWARD_TOL, "token 5 reads back v_5 alone (overwritten)")
        with torch.no_grad():  # and what was written before token 5 no longer matters for it
            changed = value.clone()
            changed[:, :5] = -2 * changed[:, :5] + 1
            other = _forward(module, query, key, changed)
        _close(other[:, 5], out[:, 5], FORWARD_TOL, "token 5 after changing the earlier values")
        assert (other[:, 2:5] - out[:, 2:5]).abs().max() > 1e-3  # while the tokens in between do see them


@pytest.mark.parametrize("strength", ["strong", "extreme"])
@pytest.mark.parametrize("heads, n, chunk", [(2, 13, 4), (3, 13, 2), (1, 9, 3), (2, 13, None), (1, 13, 13)])
def test_strong_decay_stays_finite_and_exact(registry, heads, n, chunk, strength):
    """A real decay far from 1. "strong": A_log ~ 3, softplus ~ 5, so log alpha ~ -100 per token and the segment
    sums over the sequence fall below -710 (exp of their negatives overflows float64); "extreme": A_log ~ 4.5,
    softplus ~ 12, so log alpha ~ -1000 for every single token (alpha underflows to 0: each output sees its own
    token only, o_t = beta_t (q_t . k_t) v_t / sqrt(d)). The math is finite (every decay factor <= 1); the module's
    output and gradients must be too, and equal the recurrence."""
    batch = 2
    seed = 3000 + heads * 100 + n + (7 if strength == "extreme" else 0)
    a_log, dt_bias = {"strong": ((3.0, 0.1), (5.0, 0.1)), "extreme": ((4.5, 0.1), (12.0, 0.1))}[strength]
    module = make_module(registry, heads, seed, chunk=chunk, a_log=a_log, dt_bias=dt_bias)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed)
    with torch.no_grad():
        q, k, v, beta, log_alpha = paper_inputs(module, query, key, value)
        assert (_linear(key, module.a_proj) + module.dt_bias).max() < 19  # far from any softplus threshold (20)
    if strength == "strong":
        assert log_alpha.sum(1).max() < -OVERFLOW and log_alpha.max() > -200  # the whole sequence's decay
    else:
        assert log_alpha.max() < -OVERFLOW                                        # every token's own decay
    case = (heads, n, chunk, strength)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        unr = unrolled_form(module, query, key, value)
        out = _forward(module, query, key, value)
    _close(unr, rec, FORMS_TOL, f"unrolled vs recurrence, strong decay {case}")
    _close(out, rec, FORWARD_TOL, f"module vs recurrence, strong decay {case}")
    if strength == "extreme":
        local = (beta * (q * k).sum(-1))[..., None] * v / math.sqrt(q.shape[-1])
        _close(out, _finish(module, local).detach(), FORWARD_TOL, f"module vs token-local output {case}")

    g = torch.Generator().manual_seed(50_000 + seed)
    cotangent = torch.randn(batch, n, D_MODEL[heads], generator=g, dtype=torch.float64)
    inputs = [t.clone().requires_grad_(True) for t in (query, key, value)]
    params = dict(module.named_parameters())
    names = ["A_log", "dt_bias", "a_proj.weight", "b_proj.weight", "k_proj.weight", "q_proj.weight"]
    tensors = inputs + [params[p] for p in names]
    got = _grads(_forward(module, *inputs), cotangent, tensors)
    want = _grads(recurrence_form(module, *inputs), cotangent, tensors)
    for label, a, b in zip(["query", "key", "value"] + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label}, strong decay {case}")


def test_empty_sequence(registry):
    for batch in (0, 1, 2):
        for heads in (1, 3):
            module = make_module(registry, heads, 40 + batch, chunk=4)
            query, key, value = make_inputs(batch, 0, D_MODEL[heads], 40)
            with torch.no_grad():
                out = _forward(module, query, key, value)
            assert out.shape == (batch, 0, D_MODEL[heads]) and out.dtype == torch.float64, (batch, heads, out.shape)


def _decode(dec, module, query, key, value, prefill):
    """Prefill of the first ``prefill`` tokens, then one step per token (each given copies of its own); the outputs
    concatenated, the state after the prefill and the final state."""
    out, state = dec.prefill(module, query[:, :prefill].clone(), key[:, :prefill].clone(),
                             value[:, :prefill].clone())
    outs, first = [out], {name: (t.clone() if isinstance(t, torch.Tensor) else t) for name, t in state.items()}
    for t in range(prefill, query.shape[1]):
        token = slice(t, t + 1)
        out_t, state = dec.step(module, state, query[:, token].clone(), key[:, token].clone(), value[:, token].clone())
        assert out_t.shape == (query.shape[0], 1, query.shape[2]), (t, tuple(out_t.shape))
        outs.append(out_t)
    return torch.cat(outs, 1), first, state


def _same_state(got, S, tol, what):
    """The decoder's state equals the paper's S (d_k x d_v) or its transpose (the paper's own orientation)."""
    assert got.shape == S.shape, (what, tuple(got.shape), tuple(S.shape))
    scale = max(1.0, S.abs().max().item())
    errors = [(got.double() - S).abs().max().item(), (got.double() - S.transpose(-1, -2)).abs().max().item()]
    assert min(errors) <= tol * scale, (f"{what}: the decoder's state is neither S nor S^T: max errors "
                                        f"{errors[0]:.3e}, {errors[1]:.3e} (scale {scale:.3g})")


@pytest.mark.parametrize("heads, n, chunk", [(2, 9, 2), (3, 10, None), (1, 7, 3)])
def test_decoder_matches_the_forward(registry, heads, n, chunk):
    """Prefill of p tokens then single-token steps equals the forward (and the recurrence) for p in
    {0, 1, n//2, n-1, n}, batch 2; the state is (batch, H, d, d), the recurrence's S, the same size at every step."""
    batch = 2
    d_model = D_MODEL[heads]
    d = d_model // heads
    seed = 600 + heads * 10 + n
    module = make_module(registry, heads, seed, chunk=chunk)
    dec = registry.variant(NAME).decoder
    assert dec is not None and dec.growth == "fixed"
    query, key, value = make_inputs(batch, n, d_model, seed)
    with torch.no_grad():
        forward = _forward(module, query, key, value)
        rec, S = recurrence_form(module, query, key, value, return_state=True)
    _close(forward, rec, FORWARD_TOL, "forward vs recurrence")
    for prefill in sorted({0, 1, n // 2, n - 1, n}):
        case = dict(heads=heads, n=n, chunk=chunk, prefill=prefill)
        with torch.no_grad():
            decoded, first, state = _decode(dec, module, query, key, value, prefill)
            _, S_p = recurrence_form(module, query[:, :prefill], key[:, :prefill], value[:, :prefill],
                                     return_state=True)
        _close(decoded, forward, FORWARD_TOL, f"decode vs forward {case}")
        _close(decoded, rec, FORWARD_TOL, f"decode vs recurrence {case}")
        for where, st, expected in (("after the prefill", first, S_p), ("at the end", state, S)):
            assert st["state"].shape == (batch, heads, d, d), (case, where, tuple(st["state"].shape))
            assert st["state"].dtype == torch.float64, (case, where, st["state"].dtype)
            _same_state(st["state"], expected, FORWARD_TOL, f"state {where} {case}")


@pytest.mark.parametrize("heads, n, chunk", [(2, 9, 2), (3, 10, None)])
def test_decoder_in_float32(registry, heads, n, chunk):
    """The same decode in float32: close to the float64 recurrence and to the float32 forward; the state kept in
    float32 at least."""
    batch = 2
    d_model = D_MODEL[heads]
    seed = 700 + heads * 10 + n
    module64 = make_module(registry, heads, seed, chunk=chunk)
    module = make_module(registry, heads, seed, chunk=chunk, dtype=torch.float32)
    dec = registry.variant(NAME).decoder
    query, key, value = make_inputs(batch, n, d_model, seed)
    with torch.no_grad():
        rec = recurrence_form(module64, query, key, value)
        q32, k32, v32 = (x.float() for x in (query, key, value))
        forward = _forward(module, q32, k32, v32)
    _close(forward, rec, FLOAT32_TOL, "float32 forward vs float64 recurrence", dtype=torch.float32)
    for prefill in sorted({0, 1, n // 2, n - 1}):
        case = dict(heads=heads, n=n, chunk=chunk, prefill=prefill)
        with torch.no_grad():
            decoded, _, state = _decode(dec, module, q32, k32, v32, prefill)
        _close(decoded, rec, FLOAT32_TOL, f"float32 decode vs float64 recurrence {case}", dtype=torch.float32)
        _close(decoded, forward, FLOAT32_TOL, f"float32 decode vs float32 forward {case}", dtype=torch.float32)
        assert state["state"].dtype in (torch.float32, torch.float64), (case, state["state"].dtype)
        assert torch.isfinite(state["state"]).all(), case


def test_decoder_prefill_of_nothing(registry):
    """A prefill of no tokens returns an empty output and a zero state (S_0 = 0)."""
    heads, batch = 2, 2
    module = make_module(registry, heads, 77)
    query, key, value = make_inputs(batch, 0, D_MODEL[heads], 77)
    with torch.no_grad():
        out, state = registry.variant(NAME).decoder.prefill(module, query, key, value)
    assert out.shape == (batch, 0, D_MODEL[heads])
    d = D_MODEL[heads] // heads
    assert state["state"].shape == (batch, heads, d, d)
    assert (state["state"] == 0).all()


@pytest.mark.parametrize("n, chunk, per_token", [(2, 2, 700.0), (2, 2, 711.0), (3, 3, 356.0), (4, 4, 300.0),
                                                 (4, 1, 800.0), (5, 2, 2000.0)])
def test_decay_gradients_past_the_exp_overflow(registry, n, chunk, per_token):
    """The smallest form of the strong-decay case: a_proj = 0, A_log = 0, dt_bias = L, so log alpha = -softplus(L)
    ~ -L for every token; a segment of the sequence then sums below -709 once (n - 1) L > 709 (and within a chunk
    once (chunk - 1) L > 709). The decay's gradients (A_log, dt_bias, and key through a_proj) are finite in the
    math (each is exp(segment) times a polynomial) and must equal the recurrence's."""
    heads, batch = 1, 2
    module = make_module(registry, heads, 5, chunk=chunk)
    with torch.no_grad():
        module.a_proj.weight.copy_(1e-3 * module.a_proj.weight)  # the key still reaches the decay, barely
        module.A_log.fill_(0.0)
        module.dt_bias.fill_(per_token)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 5)
    inputs = [t.clone().requires_grad_(True) for t in (query, key, value)]
    params = dict(module.named_parameters())
    names = ["A_log", "dt_bias", "a_proj.weight"]
    tensors = inputs + [params[p] for p in names]
    case = dict(n=n, chunk=chunk, per_token=per_token)
    out = _forward(module, *inputs)
    rec = recurrence_form(module, *inputs)
    _close(out.detach(), rec.detach(), FORWARD_TOL, f"module vs recurrence {case}")
    cotangent = torch.ones(batch, n, D_MODEL[heads], dtype=torch.float64)
    got, want = _grads(out, cotangent, tensors), _grads(rec, cotangent, tensors)
    for label, a, b in zip(["query", "key", "value"] + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label} {case}")
