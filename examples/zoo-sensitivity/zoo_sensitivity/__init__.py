"""A suite as a third party writes one: how far a small change to the inputs moves each variant's outputs.

The zoo knows nothing of it: it registers its suite (what it is for, its rows, what blocks ranking, its part of
the board) and its check, and the harness runs it on every variant, the gate reads its verdicts and the board
shows its section and its column beside the rank.
"""

import torch

import zoo

SUITE = "sensitivity"
EPSILON = 1e-6


def perturbation_gain(variant, profile):
    """|f(x + d) - f(x)| / |d| for a small random d, in float64: the output's local gain."""
    limit = profile.of(SUITE).gain_limit  # the suite's own setting (zoo run-all --set sensitivity.gain_limit=5)
    torch.manual_seed(profile.seed)
    module = zoo.build(variant, d_model=16, num_heads=2).double()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    d = EPSILON * torch.randn_like(x)
    with torch.no_grad():
        gain = float((module(x + d, x + d, x + d) - module(x, x, x)).norm() / d.norm())
    ok = gain <= limit
    yield zoo.Result("perturbation-gain", "passed" if ok else "failed", "batch=2 n=8 d_model=16 heads=2", gain,
                     "ratio", "" if ok else f"the output moves {gain:.3g}x the input change, over {limit:g}")


def section(board):
    """The suite's part of README.md and index.html, from its rows alone."""
    rows = board.rows(SUITE)
    gains = [{"variant": r.variant, "gain": f"{r.value:.3g}", "verdict": r.status}
             for r in rows[rows.check == "perturbation-gain"].itertuples()]
    limit = board.settings_of(SUITE).gain_limit
    return zoo.Section("Sensitivity", [f"How far a change of the inputs by {EPSILON:g} (relative) moves the outputs, "
                                       f"at most {limit:g}x. From {board.source_text(SUITE)}."],
                       [zoo.Table("", ["variant", "gain", "verdict"], gains)])


def columns(board, variant):
    """Its cell in the variant's ranked row."""
    gain = board.value(variant, "perturbation-gain")
    return {"perturbation gain": "" if gain is None else f"{gain:.3g}"}


@zoo.hookimpl
def zoo_register_suites(register):
    register(zoo.Suite(SUITE, "how far a small change to the inputs moves the outputs",
                       measures=(zoo.Measure("perturbation-gain", "output change / input change", "ratio"),),
                       blocking=("failed",), section=section, columns=columns, order=50,
                       # an attention layer that magnifies a change of its inputs this much is not stable
                       settings={"gain_limit": 10.0}))


@zoo.hookimpl
def zoo_register_checks(register):
    register(zoo.Check("perturbation-gain", SUITE, "a small change to the inputs moves the outputs at most "
                       "gain_limit times as much", perturbation_gain))
