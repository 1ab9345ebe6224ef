"""`zoo new NAME [NAME...]`: a plugin distribution that installs, lists, passes its conformance tests and runs."""

from __future__ import annotations

from pathlib import Path
from string import Template

from .contract import NAME_PATTERN, OptionError

PYPROJECT = Template('''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "zoo-$name"
version = "0.1.0"
description = "$name: an attention variant for the attention zoo."
requires-python = ">=3.10"
dependencies = ["attention-zoo"]

[project.optional-dependencies]
test = ["pytest"]

# These entry points are what make `zoo` find the plugins once the distribution is installed.
[project.entry-points.zoo]
$entry_points

[tool.setuptools]
packages = ["$module"]

# pytest's own settings for this distribution, so a folder it sits in (a zoo checkout, say) lends it none
[tool.pytest.ini_options]
testpaths = ["tests"]
''')

MODULE = Template('''"""$name: scaled dot-product attention with a temperature, as a starting point.

Replace the math in ``forward`` and ``reference`` with your variant's, keep them independent of each
other, and declare honestly what it supports in ``tags`` and what it costs in ``complexity``.
"""

from torch import nn

import zoo
from zoo.functional import cached_attention, masked_sdpa, merge_heads, split_heads
from zoo.reference import reference_mask, softmax_attention


class Attention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, temperature: float = 1.0):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature!r}")
        self.num_heads, self.temperature = num_heads, temperature

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        h = self.num_heads
        q, k, v = (split_heads(x, h) for x in (query / self.temperature, key, value))
        return merge_heads(masked_sdpa(q, k, v, attn_mask, is_causal))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """The same math in float64: slow, explicit, sharing nothing with the fast path."""
    h = module.num_heads
    q, k, v = (x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query / module.temperature, key, value))
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    return softmax_attention(q, k, v, mask).transpose(1, 2).flatten(2)


def decode(module, state, query, key, value, key_mask=None):
    """Generation token by token: the next positions' keys and values appended to a KV cache held in ``state``
    (never on the module), their queries attending to it; the correctness suite checks it equals the causal forward."""
    h = module.num_heads
    q, k, v = (split_heads(x, h) for x in (query / module.temperature, key, value))
    out, state = cached_attention(state, q, k, v, key_mask)
    return merge_heads(out), state


def state_bytes(batch, context, d_model, num_heads, itemsize, **options):
    """What the cache holds after ``context`` tokens: every key and value (checked against the counted bytes)."""
    return 2 * batch * context * d_model * itemsize


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="$name",
        summary="Scaled dot-product attention with a temperature (scaffolded by zoo new).",
        family="softmax",
        citation="Your name, year, title",
        factory=Attention,
        reference=reference,
        tags=zoo.Tags(),
        approximates=None,  # exact for its own function; an approximation names it: approximates="softmax"
        complexity=zoo.Complexity(time=2, memory=1),
        options={"temperature": 1.0},
        # how it decodes (None if it cannot): a prefill of the prompt, then one step per token; the state grows
        # without bound ("token": a KV cache), up to a window ("window") or not at all ("fixed")
        decoder=zoo.Decoder(prefill=lambda module, *inputs: decode(module, {}, *inputs), step=decode,
                            growth="token", state_bytes=state_bytes),
        # every way it differs from the cited paper (kinds: convention, omission, substitution, extension); the
        # checks compare it with its own reference and cannot see these, so readers learn them only from here
        departures=(zoo.Departure("extension", "a temperature divides the queries; the paper has none"),),
        # the label of the fastest implementation of the same math you know: one of its baselines= (checked equal
        # to it), or "torch-sdpa" where it is SDPA's own math; the board shows the variant's ratio to it
        best_known="",
    ))
''')

TESTS = Template('''"""The zoo's conformance suite, one pytest test per applicable check."""

from zoo.testing import parametrize_with_checks


# Name a check here with the reason if your variant is expected to fail it, e.g.
# expected_failures={"key-permutation": "positional by design"}.
@parametrize_with_checks($names, expected_failures={})
def test_conformance(variant, check):
    check(variant)
''')

README = Template('''# zoo-$name

Attention variants for the attention zoo: $listed.

```bash
pip install -e '.[test]'         # registers the entry points: `zoo list` shows $listed
python -m pytest                 # the zoo's conformance suite on each
zoo check $name                  # the same checks as a readable report (one variant)
zoo run-all --filter $name       # a leaderboard row (./leaderboard)
```
''')


def scaffold(names: str | list[str], directory: str | Path | None = None) -> Path:
    """Write one plugin distribution holding the variants ``names`` (a module each, an entry point each), named
    after the first; return its folder."""
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        if not NAME_PATTERN.match(name):
            raise OptionError(f"NAME {name!r} must be lower-case words joined by '-' or '_' (e.g. my-attention)")
    if len(set(names)) != len(names):
        raise OptionError(f"NAME: {sorted(n for n in set(names) if names.count(n) > 1)} given more than once")
    first = names[0]
    root = Path(directory) if directory else Path(f"zoo-{first}")
    if root.exists() and any(root.iterdir()):
        raise OptionError(f"--dir: {str(root)!r} exists and is not empty")
    package = "zoo_" + first.replace("-", "_")
    modules = {name: package if name == first else f"{package}.{name.replace('-', '_')}" for name in names}
    values = {"name": first, "module": package, "names": repr(names), "listed": ", ".join(names),
              "entry_points": "\n".join(f'{name} = "{module}"' for name, module in modules.items())}
    files = {
        root / "pyproject.toml": PYPROJECT.substitute(values),
        root / "tests" / "test_conformance.py": TESTS.substitute(values),
        root / "README.md": README.substitute(values),
        **{root / Path(*module.split(".")).with_suffix(".py") if module != package else root / package / "__init__.py":
           MODULE.substitute(name=name, module=module) for name, module in modules.items()},
    }
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    except OSError as exc:
        raise OptionError(f"--dir: cannot write to {str(root)!r} ({exc.strerror or exc})") from None
    return root
