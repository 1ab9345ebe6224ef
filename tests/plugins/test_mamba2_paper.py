"""An independent check of the "mamba2" variant (Mamba-2 / SSD, Dao & Gu, "Transformers are SSMs", ICML 2024: the
SSM layer alone, with no convolution, gate or norm), written from the paper's equations and the calling contract
only, not from the fast path.

With H heads of P = d_model / H features and a state of N = d_state features shared by every head (ngroups = 1):

    C_t = query_t Wc^T   (N)        B_t = key_t Wb^T   (N)        x_t = value_t Wx^T   (d_model = H heads of P)
    dt_t = softplus(key_t Wdt^T + bdt)   (H)        A_h = -exp(A_log_h)        a_t,h = exp(dt_t,h A_h)
    S_0 = 0,   S_t = a_t,h S_{t-1} + dt_t,h x_t,h B_t^T   (P x N, per head)
    y_t,h = S_t C_t + D_h x_t,h,     heads concatenated in order,     output = y Wo^T

Two float64 forms of that are written here, independently of each other: the token-by-token recurrence (a Python
loop over t) and SSD's quadratic "attention" form

    y_t,h = sum_{s<=t} (C_t . B_s) exp(sum_{l=s+1..t} dt_l,h A_h) dt_s,h x_s,h + D_h x_t,h

whose decay matrix is built from explicit sums over l (an indicator tensor), not from cumsum differences. They are
checked against each other, then the module's forward and the registered reference against them, and the module's
gradients against autograd through the recurrence; then properties that follow from the math: A -> 0 gives
un-normalised causal linear attention with keys dt_s B_s, the chunk size changes nothing, the output is causal,
and a strong decay (segment sums of hundreds) still gives finite outputs and gradients equal to the recurrence.
"""

import math

import pytest
import torch

import zoo

from paper_checks import make_inputs, close as _close, grads as _grads


NAME = "mamba2"
HEAD_DIM = 3    # P: odd, so heads are not power-of-two slices
D_STATE = 5     # N
FORMS_TOL = 1e-12    # the two paper forms against each other (relative to the output scale)
FORWARD_TOL = 1e-11  # the module / the registered reference against the paper forms (relative)
GRAD_TOL = 1e-10     # gradients (relative to each gradient's scale)


# --------------------------------------------------------------------------------------------------------------
# The independent float64 forms
# --------------------------------------------------------------------------------------------------------------

def _linear(x, layer):
    """x W^T (+ b), written out."""
    y = x @ layer.weight.transpose(0, 1)
    return y if layer.bias is None else y + layer.bias


def _softplus(z):
    """log(1 + exp(z)), in a form that neither overflows nor switches to z above a threshold."""
    return z.clamp_min(0) + torch.log1p(torch.exp(-z.abs()))


def paper_inputs(module, query, key, value):
    """C (b, n, N), B (b, n, N), x (b, n, H, P), dt (b, n, H), A (H,), D (H,) per the paper's projections."""
    for t in (query, key, value):
        assert t.dtype == torch.float64
    heads = module.num_heads
    C = _linear(query, module.c_proj)
    B = _linear(key, module.b_proj)
    x = _linear(value, module.x_proj)
    x = x.reshape(x.shape[0], x.shape[1], heads, module.x_proj.out_features // heads)  # head h: [h P, (h + 1) P)
    dt = _softplus(_linear(key, module.dt_proj))
    A = -torch.exp(module.A_log)
    return C, B, x, dt, A, module.D


def _finish(module, y):
    """Concatenate the heads in order (b, n, H, P) -> (b, n, d_model) and apply the output projection."""
    batch, n, heads, P = y.shape
    return _linear(y.reshape(batch, n, heads * P), module.out_proj)


def recurrence_form(module, query, key, value):
    """The token-by-token recurrence: S_t = a_t S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D x_t."""
    C, B, x, dt, A, D = paper_inputs(module, query, key, value)
    batch, n, heads, P = x.shape
    S = torch.zeros(batch, heads, P, C.shape[-1], dtype=torch.float64)               # S_0 = 0
    ys = []
    for t in range(n):
        a = torch.exp(dt[:, t] * A)                                                     # (b, H)
        outer = x[:, t, :, :, None] * B[:, t, None, None, :]                            # (b, H, P, N)
        S = a[:, :, None, None] * S + dt[:, t, :, None, None] * outer
        y = (S * C[:, t, None, None, :]).sum(-1) + D[None, :, None] * x[:, t]          # (b, H, P)
        ys.append(y)
    y = torch.stack(ys, 1) if ys else x.new_zeros(batch, 0, heads, P)
    return _finish(module, y)


def quadratic_form(module, query, key, value):
    """SSD's attention form: y_t = sum_{s<=t} (C_t . B_s) exp(sum_{s<l<=t} dt_l A) dt_s x_s + D x_t, with the
    segment sums taken over an explicit indicator [s < l <= t] (no cumsum differences)."""
    C, B, x, dt, A, D = paper_inputs(module, query, key, value)
    batch, n, heads, P = x.shape
    t_ = torch.arange(n).view(n, 1, 1)
    s_ = torch.arange(n).view(1, n, 1)
    l_ = torch.arange(n).view(1, 1, n)
    between = ((s_ < l_) & (l_ <= t_)).to(torch.float64)                                # (t, s, l)
    # segment[b, h, t, s] = sum_l [s < l <= t] dt[b, l, h] A_h
    segment = (between[None, :, :, :, None] * dt[:, None, None, :, :]).sum(3)           # (b, t, s, H)
    segment = segment.permute(0, 3, 1, 2) * A[None, :, None, None]                      # (b, H, t, s)
    lower = (s_[..., 0] <= t_[..., 0])                                                  # (t, s): s <= t
    decay = torch.where(lower, torch.exp(segment), torch.zeros((), dtype=torch.float64))  # segment = 0 where s > t
    scores = (C[:, :, None, :] * B[:, None, :, :]).sum(-1)                              # (b, t, s): C_t . B_s
    weights = scores[:, None] * decay * dt.permute(0, 2, 1)[:, :, None, :]              # (b, H, t, s) * dt_s
    xh = x.permute(0, 2, 1, 3)                                                          # (b, H, s, P)
    y = (weights[..., None] * xh[:, :, None, :, :]).sum(3)                              # (b, H, t, P)
    y = y + D[None, :, None, None] * xh
    return _finish(module, y.permute(0, 2, 1, 3))


def causal_linear_attention(module, query, key, value):
    """With A = 0 (a_t = 1): y_t,h = sum_{s<=t} (C_t . (dt_s,h B_s)) x_s,h + D_h x_t,h, an explicit causal sum
    over s for each t (un-normalised linear attention with queries C_t, keys dt_s B_s and values x_s)."""
    C, B, x, dt, _, D = paper_inputs(module, query, key, value)
    batch, n, heads, P = x.shape
    rows = []
    for t in range(n):
        keys = dt[:, :t + 1, :, None] * B[:, :t + 1, None, :]                          # (b, s, H, N)
        w = (C[:, t, None, None, :] * keys).sum(-1)                                     # (b, s, H)
        rows.append((w[..., None] * x[:, :t + 1]).sum(1) + D[None, :, None] * x[:, t])  # (b, H, P)
    y = torch.stack(rows, 1) if rows else x.new_zeros(batch, 0, heads, P)
    return _finish(module, y)


# --------------------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------------------

def make_module(registry, heads, seed, chunk=None, a_log=(0.0, 0.5), dt_bias=(-1.0, 0.5), d_state=D_STATE):
    """A float64 mamba2 module with every parameter drawn from a seeded generator: weights of scale 1/sqrt(fan_in),
    A_log ~ normal(a_log), dt_proj.bias ~ normal(dt_bias), D ~ normal(0, 1)."""
    torch.manual_seed(seed)
    d_model = heads * HEAD_DIM
    options = {} if chunk is None else {"chunk": chunk}
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, d_state=d_state, registry=registry, **options).double()
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for layer in (module.c_proj, module.b_proj, module.x_proj, module.dt_proj, module.out_proj):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64) / math.sqrt(d_model))
        module.dt_proj.bias.copy_(dt_bias[0] + dt_bias[1] * torch.randn(heads, generator=g, dtype=torch.float64))
        module.A_log.copy_(a_log[0] + a_log[1] * torch.randn(heads, generator=g, dtype=torch.float64))
        module.D.copy_(torch.randn(heads, generator=g, dtype=torch.float64))
    return module


# --------------------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------------------

def test_recurrence_equals_scalar_loops():
    """The recurrence form itself, against plain-Python scalar loops over every index straight from the
    equations (batch 2, 2 heads, n = 4)."""
    class Holder(torch.nn.Module):
        def __init__(self, heads, d_model, d_state):
            super().__init__()
            self.num_heads, self.d_model = heads, d_model
            self.c_proj = torch.nn.Linear(d_model, d_state, bias=False).double()
            self.b_proj = torch.nn.Linear(d_model, d_state, bias=False).double()
            self.x_proj = torch.nn.Linear(d_model, d_model, bias=False).double()
            self.dt_proj = torch.nn.Linear(d_model, heads, bias=True).double()
            self.out_proj = torch.nn.Linear(d_model, d_model, bias=False).double()
            self.A_log = torch.nn.Parameter(torch.zeros(heads, dtype=torch.float64))
            self.D = torch.nn.Parameter(torch.zeros(heads, dtype=torch.float64))

    g = torch.Generator().manual_seed(3)
    heads, P, N = 2, 2, 3
    d_model = heads * P
    m = Holder(heads, d_model, N)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.7 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    batch, n = 2, 4
    q, k, v = (torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        out = recurrence_form(m, q, k, v)
        quad = quadratic_form(m, q, k, v)

    w = lambda layer, f, c: layer.weight[f, c].item()
    proj = lambda inp, layer, b, t, f: sum(inp[b, t, c].item() * w(layer, f, c) for c in range(d_model))
    for b in range(batch):
        S = [[[0.0] * N for _ in range(P)] for _ in range(heads)]
        for t in range(n):
            Ct = [proj(q, m.c_proj, b, t, i) for i in range(N)]
            Bt = [proj(k, m.b_proj, b, t, i) for i in range(N)]
            xt = [proj(v, m.x_proj, b, t, f) for f in range(d_model)]
            y = [0.0] * d_model
            for h in range(heads):
                z = proj(k, m.dt_proj, b, t, h) + m.dt_proj.bias[h].item()
                dt = math.log1p(math.exp(z))
                a = math.exp(dt * -math.exp(m.A_log[h].item()))
                for p in range(P):
                    for i in range(N):
                        S[h][p][i] = a * S[h][p][i] + dt * xt[h * P + p] * Bt[i]
                    y[h * P + p] = sum(S[h][p][i] * Ct[i] for i in range(N)) + m.D[h].item() * xt[h * P + p]
            for f in range(d_model):
                expected = sum(y[c] * w(m.out_proj, f, c) for c in range(d_model))
                assert abs(out[b, t, f].item() - expected) <= 1e-12, (b, t, f, out[b, t, f].item(), expected)
                assert abs(quad[b, t, f].item() - expected) <= 1e-12, (b, t, f, quad[b, t, f].item(), expected)


def test_module_has_the_contract_parameters(registry):
    heads, d_model = 3, 3 * HEAD_DIM
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, d_state=D_STATE, registry=registry)
    assert module.num_heads == heads
    shapes = {"c_proj": (D_STATE, d_model, False), "b_proj": (D_STATE, d_model, False),
              "x_proj": (d_model, d_model, False), "dt_proj": (heads, d_model, True),
              "out_proj": (d_model, d_model, False)}
    for name, (out_features, in_features, bias) in shapes.items():
        layer = getattr(module, name)
        assert isinstance(layer, torch.nn.Linear), name
        assert (layer.out_features, layer.in_features, layer.bias is not None) == (out_features, in_features, bias), name
    for name in ("A_log", "D"):
        assert isinstance(getattr(module, name), torch.nn.Parameter) and getattr(module, name).shape == (heads,), name
    expected = {f"{n}.weight" for n in shapes} | {"dt_proj.bias", "A_log", "D"}
    assert {name for name, _ in module.named_parameters()} == expected  # nothing the paper's SSM layer lacks


FORM_CASES = [(batch, heads, n, same)
              for batch in (1, 2) for heads in (1, 2, 3) for n in (0, 1, 5, 7, 13) for same in (False, True)]


@pytest.mark.parametrize("batch, heads, n, same", FORM_CASES)
def test_recurrence_and_quadratic_forms_agree(registry, batch, heads, n, same):
    seed = FORM_CASES.index((batch, heads, n, same))
    module = make_module(registry, heads, seed)
    query, key, value = make_inputs(batch, n, module.num_heads * HEAD_DIM, seed, same)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        quad = quadratic_form(module, query, key, value)
    _close(quad, rec, FORMS_TOL, f"quadratic vs recurrence {(batch, heads, n, same)}")
    if n > 1 and batch:  # the decay is real: a_t well inside (0, 1), so this is not linear attention
        _, _, _, dt, A, _ = paper_inputs(module, query, key, value)
        a = torch.exp(dt * A)
        assert a.min() < 0.9 and a.max() < 1 - 1e-3


CASES = [(batch, heads, n, chunk)
         for batch in (0, 1, 2)
         for heads in (1, 2, 3)
         for n in (0, 1, 5, 7, 13)
         for chunk in (2, 3, 4, None)]


@pytest.mark.parametrize("batch, heads, n, chunk", CASES)
def test_forward_reference_and_gradients_match_the_paper(registry, batch, heads, n, chunk):
    seed = CASES.index((batch, heads, n, chunk))
    module = make_module(registry, heads, seed, chunk=chunk)
    d_model = module.num_heads * HEAD_DIM
    same = seed % 3 == 0  # self-attention (one tensor) in a third of the cases
    query, key, value = make_inputs(batch, n, d_model, seed, same)
    case = dict(batch=batch, heads=heads, n=n, chunk=chunk, same=same, seed=seed)

    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        quad = quadratic_form(module, query, key, value)
        out = module(query, key, value, attn_mask=None, is_causal=True)
        registered = registry.variant(NAME).reference(module, query, key, value, attn_mask=None, is_causal=True)
    _close(quad, rec, FORMS_TOL, f"quadratic vs recurrence {case}")
    assert out.shape == (batch, n, d_model), case
    _close(out, rec, FORWARD_TOL, f"module forward vs recurrence {case}")
    _close(out, quad, FORWARD_TOL, f"module forward vs quadratic form {case}")
    _close(registered.double(), rec, FORWARD_TOL, f"registered reference vs recurrence {case}")

    # gradients: query, key, value, A_log, D, dt_proj.bias and every other parameter, for a random cotangent
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
    first = ["A_log", "D", "dt_proj.bias"]
    names = first + sorted(set(params) - set(first))
    tensors = inputs + [params[p] for p in names]
    got = _grads(module(*call, attn_mask=None, is_causal=True), cotangent, tensors)
    want = _grads(recurrence_form(module, *call), cotangent, tensors)
    for label, a, b in zip(labels + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label} {case}")


@pytest.mark.parametrize("batch, heads, n, chunk", [(2, 1, 13, 3), (2, 2, 7, 2), (1, 3, 5, 4), (2, 2, 13, None),
                                                    (0, 2, 5, 2), (1, 1, 0, 3), (1, 2, 1, 2)])
def test_no_decay_is_causal_linear_attention(registry, batch, heads, n, chunk):
    """A_log = -30: A = -exp(-30) ~ -1e-13 and a_t = 1 to ~1e-12, so the layer is un-normalised causal linear
    attention with queries C_t, keys dt_s B_s, values x_s, plus the D skip."""
    seed = 500 + batch * 100 + heads * 10 + n
    module = make_module(registry, heads, seed, chunk=chunk)
    with torch.no_grad():
        module.A_log.fill_(-30.0)
    query, key, value = make_inputs(batch, n, module.num_heads * HEAD_DIM, seed)
    case = (batch, heads, n, chunk)
    with torch.no_grad():
        linear = causal_linear_attention(module, query, key, value)
        out = module(query, key, value, attn_mask=None, is_causal=True)
        rec = recurrence_form(module, query, key, value)
    _close(rec, linear, FORWARD_TOL, f"recurrence vs causal linear attention {case}")
    _close(out, linear, FORWARD_TOL, f"module vs causal linear attention {case}")
    with torch.no_grad():  # and with a real decay the same inputs do not give linear attention
        module.A_log.fill_(0.0)
        decayed = module(query, key, value, attn_mask=None, is_causal=True)
    if batch and n > 1:
        assert (decayed - linear).abs().max() > 1e-3


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_chunk_size_changes_nothing(registry, heads):
    """The chunk is a schedule, not the math: every chunk size gives the same output (n = 13, a partial chunk
    for 2, 3, 4, 5 and 8; one chunk for 13 and 16)."""
    n, batch = 13, 2
    outs = {}
    for chunk in (1, 2, 3, 4, 5, 8, 13, 16):
        module = make_module(registry, heads, 7, chunk=chunk)  # the same seed: the same parameters
        query, key, value = make_inputs(batch, n, module.num_heads * HEAD_DIM, 7)
        with torch.no_grad():
            outs[chunk] = module(query, key, value, attn_mask=None, is_causal=True)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
    for chunk, out in outs.items():
        _close(out, rec, FORWARD_TOL, f"chunk={chunk} vs recurrence (heads={heads})")


@pytest.mark.parametrize("chunk", [2, 3, None])
def test_output_is_causal(registry, chunk):
    """Changing query, key and value from token t on leaves the outputs before t exactly as they were."""
    heads, batch, n = 2, 2, 11
    module = make_module(registry, heads, 11, chunk=chunk)
    query, key, value = make_inputs(batch, n, module.num_heads * HEAD_DIM, 11)
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        base = module(query, key, value, attn_mask=None, is_causal=True)
        for t in (0, 1, 4, 6, 10):
            moved = [x.clone() for x in (query, key, value)]
            for x in moved:
                x[:, t:] += torch.randn(x[:, t:].shape, generator=g, dtype=torch.float64)
            out = module(*moved, attn_mask=None, is_causal=True)
            _close(out[:, :t], base[:, :t], 1e-13, f"outputs before t={t} after changing tokens >= t")
            assert (out[:, t] - base[:, t]).abs().max() > 1e-6  # and token t itself does move


OVERFLOW = math.log(torch.finfo(torch.float64).max)  # ~709.8: exp of more than this is inf in float64


@pytest.mark.parametrize("strength", ["strong", "extreme"])
@pytest.mark.parametrize("heads, n, chunk", [(2, 13, 4), (3, 13, 2), (1, 9, 3), (2, 13, None)])
def test_strong_decay_stays_finite_and_exact(registry, heads, n, chunk, strength):
    """A real decay far from 1. "strong": A_log ~ 3, dt ~ 5, so dt A ~ -100 per token and the segment sums over
    the sequence fall below -710 (exp of their negatives overflows float64); "extreme": A_log ~ 4.5, dt ~ 12, so
    dt A ~ -1000 for every single token (a_t underflows to 0: each output sees its own token only). The math is
    finite (every factor exp(segment) <= 1); the module's output and gradients must be too, and equal the
    recurrence."""
    batch = 2
    seed = 3000 + heads * 100 + n + (7 if strength == "extreme" else 0)
    a_log, dt_bias = {"strong": ((3.0, 0.1), (5.0, 0.1)), "extreme": ((4.5, 0.1), (12.0, 0.1))}[strength]
    module = make_module(registry, heads, seed, chunk=chunk, a_log=a_log, dt_bias=dt_bias)
    query, key, value = make_inputs(batch, n, module.num_heads * HEAD_DIM, seed)
    with torch.no_grad():
        _, _, _, dt, A, _ = paper_inputs(module, query, key, value)
        assert (module.dt_proj(key)).max() < 19  # far from any softplus threshold (torch's is 20)
    if strength == "strong":
        assert (dt * A).sum(1).max() < -OVERFLOW  # the whole sequence's decay, per (batch, head)
    else:
        assert (dt * A).max() < -OVERFLOW         # every token's own decay
    case = (heads, n, chunk, strength)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        quad = quadratic_form(module, query, key, value)
        out = module(query, key, value, attn_mask=None, is_causal=True)
    _close(quad, rec, FORMS_TOL, f"quadratic vs recurrence, strong decay {case}")
    _close(out, rec, FORWARD_TOL, f"module vs recurrence, strong decay {case}")

    g = torch.Generator().manual_seed(50_000 + seed)
    cotangent = torch.randn(batch, n, module.num_heads * HEAD_DIM, generator=g, dtype=torch.float64)
    inputs = [t.clone().requires_grad_(True) for t in (query, key, value)]
    names = ["A_log", "D", "dt_proj.bias"]
    tensors = inputs + [dict(module.named_parameters())[p] for p in names]
    got = _grads(module(*inputs, attn_mask=None, is_causal=True), cotangent, tensors)
    want = _grads(recurrence_form(module, *inputs), cotangent, tensors)
    for label, a, b in zip(["query", "key", "value"] + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label}, strong decay {case}")
