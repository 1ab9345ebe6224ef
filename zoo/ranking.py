"""Ranking: which variants may be ranked (the gate, from each suite's blocking rules) and in what order (the
figure of the one suite that ranks), shared by README.md, the page, ``zoo leaderboard --by device`` and the
summary a run ends with.

A variant is ranked only when every ``required`` suite ran on its current source and passed, and none of its
rows has a status its suite says blocks (an ``error`` in any suite does, except a job its worker did not finish
outside the required suites: a timeout there leaves that suite's figures missing, not the variant unranked).
Rows of an older source are not on the board (:mod:`zoo.board`): they neither rank a variant nor block it, and
its standing names them. Within its kind (cores, layers: like is compared with like), ranked
variants are ordered by the ranking figure, lower first; one without a figure comes last, with the reason. Places
whose figures' intervals overlap are tied: they share a rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .board import KIND_TITLES, Board, approximates, checked_by, origin_text, runs_text
from .checks import FAILED, WORKER_CHECK
from .suite import Axis, Suite, implicit_suite


@dataclass
class Standing:
    """Whether a variant may be ranked: the required suites ran on the code that was measured, and nothing
    blocking happened (``reasons``: each blocking row, and a source that changed between runs)."""

    checked: bool
    reasons: list[str] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)  # the suites whose rows block it
    stale: list[str] = field(default_factory=list)  # the suites whose rows measured an older source (dropped)
    blocking_suites: list[str] = field(default_factory=list)  # the suites of every blocking row (errors included)

    @property
    def ranked(self) -> bool:
        """Ranked: checked, and nothing blocks it."""
        return self.checked and not self.reasons


def gate(results: pd.DataFrame, suites: dict[str, Suite] | None = None,
         stale: dict[str, list[str]] | None = None) -> dict[str, Standing]:
    """Per variant: did the required suites run on it and pass, and which rows block it (see the module), by
    the rules of ``suites`` (default: the registered ones); ``stale``: variant -> the suites whose rows of an
    older source were left off."""
    if suites is None:
        from .leaderboard import registered_suites

        suites = registered_suites()
    stale = stale or {}
    required = [name for name, suite in suites.items() if suite.required]
    rules = {name: suites.get(name) or implicit_suite(name) for name in set(results.suite)}
    standings: dict[str, Standing] = {}
    for variant, rows in results.groupby("variant"):
        blocking = rows[[_blocks(rules[r.suite], r) for r in rows.itertuples()]]
        checked = all(checked_by(rows, name) for name in required) and bool(required)
        reasons = [f"{r.suite}/{r.check}: {r.detail or r.status}" + (f" [{r.setting}]" if r.setting else "")
                   for r in blocking.itertuples()]
        blocked_by = sorted(set(blocking[blocking.status == FAILED].suite))
        standings[variant] = Standing(checked, reasons, blocked_by, list(stale.get(variant, [])),
                                      sorted(set(blocking.suite), key=lambda name: rules[name].order))
    for variant in set(stale) - set(standings):  # every row it has is of an older source
        standings[variant] = Standing(False, stale=list(stale[variant]))
    return standings


def _blocks(suite: Suite, row) -> bool:
    """Whether ``row`` keeps its variant out of the ranking: by its suite's rules, except that a job its worker did
    not finish (a timeout, a crash) blocks only in a required suite: the other suites' figures are then missing,
    not wrong."""
    return suite.blocks(row.status) and (row.check != WORKER_CHECK or suite.required)


def standing_text(standing: Standing, required: list[str]) -> str:
    """'' for a ranked variant, else a few words: 'fails correctness', 'error', 'correctness not run',
    'correctness of an older source'."""
    if standing.reasons:
        return f"fails {', '.join(standing.blocked_by)}" if standing.blocked_by else "error"
    if standing.checked:
        return ""
    old = [name for name in required if name in standing.stale]
    return f"{' and '.join(old)} of an older source" if old else f"{' and '.join(required) or 'no required suite'} not run"


def gate_sentence(board: Board) -> str:
    """The gate in one sentence, for the ranking's intro."""
    required = " and ".join(board.required_suites()) or "no"
    return (f"Ranked only when the {required} suite ran on the variant's measured source and every check passed, "
            "with no error in any suite (NaN or inf outputs included; a job of another suite stopped by its time "
            "limit or a crash leaves that suite's figures missing instead).")


def ranked_tables(board: Board) -> tuple[dict[str, list[dict]], list[str]]:
    """The ranked rows of each kind ({kind: [row, ...]}, exact variants first, then approximations ranked among
    themselves, each best first with its rank and class) and the variants not ranked: the ranking suite's columns
    first, then each other suite's in board order, whether it is on its kind's Pareto front, and its origin."""
    suites = sorted((board.suite(n) for n in {*board.suites, *board.results.suite.unique()}),
                    key=lambda s: (s.ranking is None, s.order))
    tables, unranked = {}, []
    for kind in KIND_TITLES:
        members = [v for v in board.variants if board.kind(v) == kind]
        if not members:
            continue
        ranked = []
        for variant in members:
            if not board.ranked(variant):
                unranked.append(variant)
                continue
            target = approximates(board.card(variant))
            exact = target is None
            row = {"class": "exact" if exact else f"approximates {target}", "variant": variant,
                   "family": board.card(variant).get("family")}
            for suite in suites:
                if suite.columns:
                    row.update(suite.columns(board, variant))
            row["origin"] = origin_text(board.cards[variant])
            row["from"] = runs_text(board.rows(variant=variant).run_id, board.run_id)
            figure = board.rank_figure(variant)
            ranked.append((not exact, float("inf") if figure is None or figure.value is None else figure.value, row,
                           figure))
        ranked.sort(key=lambda item: item[:2])
        front = pareto_front(board, [row["variant"] for *_, row, _ in ranked])
        rows = []
        for exact_class in (False, True):
            group = [(row, figure) for approximate, _, row, figure in ranked if approximate == exact_class]
            rows += [{"rank": place, **row, "Pareto front": front[row["variant"]]}
                     for place, (row, _) in zip(places([f for _, f in group]), group)]
        tables[kind] = rows
    return tables, unranked


def axes_of(board: Board, variant: str) -> list[Axis]:
    """Every figure a reader weighs ``variant`` on, from each suite that gives them: the ranking suite's first."""
    suites = sorted((board.suite(name) for name in board.suite_order()), key=lambda s: (s.ranking is None, s.order))
    return [axis for suite in suites if suite.axes for axis in suite.axes(board, variant)]


def figures_of(board: Board, variants: list[str]) -> dict[str, dict[str, Axis]]:
    """Each variant's figures by name (:func:`axes_of`)."""
    return {v: {axis.name: axis for axis in axes_of(board, v)} for v in variants}


def _measured(name: str, variants: list[str], figures) -> list[str]:
    """The variants that have a value for figure ``name``."""
    return [v for v in variants if figures[v].get(name) and figures[v][name].value is not None]


def dominates(mine: dict[str, Axis], theirs: dict[str, Axis]) -> bool:
    """``mine`` is at least as good on every figure ``theirs`` has measured (within each one's tie) and better on
    one: a figure only the other has measured is never assumed."""
    better = False
    for name, other in theirs.items():
        if other.value is None:
            continue
        axis = mine.get(name)
        if axis is None or axis.value is None or other.beats(axis):
            return False
        better = better or axis.beats(other)
    return better


def pareto_front(board: Board, variants: list[str]) -> dict[str, str]:
    """Per variant of one kind: 'yes' when no other of them dominates it on every figure (:func:`dominates`),
    else which one does."""
    figures = figures_of(board, variants)
    out = {}
    for variant in variants:
        beaten_by = [other for other in variants if other != variant and dominates(figures[other], figures[variant])]
        out[variant] = "yes" if not beaten_by else (f"no: {beaten_by[0]} is as good on every figure (or within its "
                                                    "tie), better on one")
    return out


@dataclass
class Pick:
    """One answer to 'which should I use?': the variant, whether it is exact, its figure, and what it costs."""

    variant: str
    exact: bool
    figure: str
    costs: list[str]
    tied: list[str] = field(default_factory=list)  # others it does not beat on the figure (within its tie)
    keeping: str = ""  # the cost it was held to: 'quality: mean accuracy within 0.05 of the best'

    def sentence(self) -> str:
        """The pick as the board says it: 'linear (an approximation: 0.24x), at a cost: ...'."""
        cost = "at a cost: " + "; ".join(self.costs) if self.costs else "at no measured cost"
        tied = f"; tied on it with {', '.join(self.tied)}" if self.tied else ""
        keeping = f"keeping {self.keeping}, " if self.keeping else ""
        return f"{keeping}{self.variant} ({'exact' if self.exact else 'an approximation'}: {self.figure}{tied}), {cost}"


@dataclass
class Advice:
    """The answer for one kind and one use: ``by`` the figure it is judged on, ``picks`` best exact first;
    ``passed_over``: the variant best on that figure when it is not offered, and why (a figure over its ceiling)."""

    kind: str
    use: str
    by: str
    picks: list[Pick]
    passed_over: str = ""

    def sentence(self) -> str:
        """The answer as one line of the board."""
        return f"{KIND_TITLES[self.kind].split(' (')[0]}, {self.use} (by {self.by}): " + "; or ".join(
            pick.sentence() for pick in self.picks) + (f"; not offered: {self.passed_over}" if self.passed_over
                                                      else "") + "."


def advice(board: Board, tables: dict[str, list[dict]]) -> list[Advice]:
    """'Which should I use?', from the ranked variants' figures: per kind and per use (each figure that is a reason
    to choose), the best exact variant and, when an approximation is better on it, that one too; then, for each cost
    a reader may hold to (:attr:`Axis.keep`), the best of those within that of the kind's top value, when it is
    another; each with what it costs: the figures it trails its kind's best on. A variant over a figure's ceiling
    (:meth:`Axis.admits`) is not offered; when it would have been the best, the answer names it and why."""
    answers = []
    for kind, rows in tables.items():
        variants = [row["variant"] for row in rows]
        exact = {row["variant"] for row in rows if row["class"] == "exact"}
        figures = figures_of(board, variants)
        uses = {axis.name: axis.use for v in variants for axis in figures[v].values() if axis.use}
        costs = sorted({axis.name for v in variants for axis in figures[v].values() if not axis.use})
        for name, use in uses.items():
            measured = _measured(name, variants, figures)
            offered = [v for v in measured if all(axis.admits() for axis in figures[v].values())]
            pools = ([v for v in offered if v in exact], offered)
            picks = {p: (pool, "") for pool in pools for p in [_best(name, pool, figures)] if p}
            for cost in costs:
                pool, keeping = _kept(cost, offered, variants, figures)
                pick = _best(name, pool, figures)
                if pick and pick not in picks:
                    picks[pick] = (pool, keeping)
            best = _best(name, measured, figures)
            if picks:
                answers.append(Advice(kind, use, name, [Pick(v, v in exact, figures[v][name].text,
                                                             _costs(v, costs, variants, figures),
                                                             _tied(v, name, pool, figures), keeping)
                                                        for v, (pool, keeping) in picks.items()],
                                      "" if best in picks else _passed_over(best, name, figures[best])))
    return answers


def _kept(cost: str, offered: list[str], variants: list[str], figures) -> tuple[list[str], str]:
    """Those of ``offered`` within the ``keep`` of figure ``cost`` of its kind's top value, and that hold as the
    board says it: 'quality: mean accuracy within 0.05 of the best' ([] when the figure has no keep)."""
    measured = _measured(cost, variants, figures)
    keep = next((figures[v][cost].keep for v in measured if figures[v][cost].keep is not None), None)
    if keep is None:
        return [], ""
    best = figures[_top(cost, measured, figures)][cost]
    sign = 1 if best.better == "lower" else -1
    pool = [v for v in _measured(cost, offered, figures) if sign * (figures[v][cost].value - best.value) <= keep]
    return pool, f"{cost} within {keep:g} of the best"


def ranked_axes(board: Board, tables: dict[str, list[dict]]) -> list[Axis]:
    """Every figure of every ranked variant (what :func:`ceilings` and :func:`ties` state)."""
    return [axis for rows in tables.values() for row in rows for axis in axes_of(board, row["variant"])]


def ties(axes: list[Axis]) -> list[str]:
    """The differences within which the answers and the Pareto front count two figures as equal, as the board
    states them: 'quality: mean accuracy within 0.02'."""
    found = {axis.name: axis.tie for axis in axes if axis.tie}
    return [f"{name} within {tie:g}" for name, tie in found.items()] + (
        ["figures whose intervals overlap (as the ranking ties them)"] if any(a.low is not None for a in axes) else [])


def keeps(axes: list[Axis]) -> list[str]:
    """The costs each answer also holds a pick to, as the board states them: 'quality: mean accuracy within 0.05 of
    its kind's best'."""
    found = {axis.name: axis.keep for axis in axes if axis.keep is not None}
    return [f"{name} within {keep:g} of its kind's best" for name, keep in found.items()]


def ceilings(axes: list[Axis]) -> list[str]:
    """The ceilings the answers to 'which should I use?' hold to, as the board states them: 'approximation error,
    n=1024 at most 0.5'."""
    found = {axis.name: axis.ceiling for axis in axes if axis.ceiling is not None}
    return [f"{name} at most {ceiling:g}" for name, ceiling in found.items()]


def _passed_over(variant: str, name: str, figures: dict[str, Axis]) -> str:
    """'linear (0.222x [0.218-0.232]): approximation error, n=1024: 0.93 (of softmax), over its ceiling of 0.5'."""
    over = [f"{axis.name}: {axis.text}" + (f", over its ceiling of {axis.ceiling:g}" if axis.value is not None
                                          else f" (its ceiling: {axis.ceiling:g})")
            for axis in figures.values() if not axis.admits()]
    return f"{variant} ({figures[name].text}): {'; '.join(over)}"


def _best(name: str, variants: list[str], figures) -> str | None:
    """The variant best on figure ``name``: lowest (or highest), ties broken by board order (the ranking)."""
    best = None
    for variant in variants:
        if best is None or figures[variant][name].beats(figures[best][name]):
            best = variant
    return best


def _top(name: str, variants: list[str], figures) -> str | None:
    """The variant with the best value of figure ``name``, ties or not (the one a reader sees on top)."""
    if not variants:
        return None
    sign = 1 if figures[variants[0]][name].better == "lower" else -1
    return min(variants, key=lambda v: sign * figures[v][name].value)


def _tied(pick: str, name: str, pool: list[str], figures) -> list[str]:
    """The others of ``pool`` that ``pick`` does not beat on figure ``name`` (within its tie)."""
    mine = figures[pick][name]
    return [v for v in _measured(name, pool, figures) if v != pick and not mine.beats(figures[v][name])]


def _costs(pick: str, costs: list[str], variants: list[str], figures) -> list[str]:
    """The cost figures ``pick`` trails its kind's best on by more than their tie (or has not measured): 'quality:
    0.73 (the best: x, 0.89)', the best being the top value."""
    trails = []
    for name in costs:
        mine = figures[pick].get(name)
        if mine is None or mine.value is None:
            trails.append(f"{name}: not measured")
            continue
        best = _top(name, _measured(name, variants, figures), figures)
        if figures[best][name].beats(mine):
            trails.append(f"{name}: {mine.text} (the best: {best}, {figures[best][name].text})")
    return trails


def places(figures: list) -> list[int]:
    """Each figure's place, best first (``figures`` sorted): one whose interval overlaps the one before it shares
    its place, so two runs can only order differently what a board declared tied."""
    out: list[int] = []
    for index, figure in enumerate(figures):
        tied = index and _overlap(figures[index - 1], figure)
        out.append(out[-1] if tied else index + 1)
    return out


def _overlap(a, b) -> bool:
    ends = [getattr(figure, name, None) for figure in (a, b) for name in ("value", "low", "high")]
    return None not in ends and a.low <= b.high and b.low <= a.high


def unranked_lines(board: Board, unranked: list[str]) -> list[str]:
    """README's account of the variants not ranked: what blocks each, or which required suite has not run."""
    from .board import cell

    lines = []
    failing = [v for v in unranked if board.standings.get(v) and board.standings[v].reasons]
    if failing:
        blockers = [name for name in sorted(board.suites, key=lambda n: board.suite(n).order)
                    if FAILED in board.suite(name).blocking]
        lines += [f"### Not ranked: failing {' or '.join(blockers) + ' ' if blockers else ''}checks or errors", ""]
        for variant in failing:
            by_check: dict[str, list[str]] = {}
            for reason in board.standings[variant].reasons:
                check, _, detail = reason.partition(": ")
                by_check.setdefault(check, []).append(detail)
            lines.append(f"- **{cell(variant)}**, {len(by_check)} failing check(s):")
            lines += [f"  - {cell(check)} ({len(details)} case(s)), e.g. {cell(details[0])}"
                      for check, details in by_check.items()]
        lines.append("")
    unchecked = [v for v in unranked if v not in failing]
    old_source = [v for v in unchecked if set(board.required_suites()) & set(board.standings[v].stale)]
    if old_source:
        lines += [f"### Unranked: {' and '.join(board.required_suites())} of an older source", "",
                  "Their source changed after those suites ran, so those rows are left off; to rank them:", "",
                  *[f"- **{cell(v)}**: {board.refresh_command(v, list(board.stale(v)), markdown=True)}" for v in old_source], ""]
    unchecked = [v for v in unchecked if v not in old_source]
    if unchecked:
        required = " and ".join(board.required_suites())
        lines += [f"### Unranked: {required} not run", "",
                  f"These variants' figures below were measured, but the {required} suite has not run on them with "
                  f"these settings, so they are not ranked (`zoo run NAME --suite {required}` with the same `--out`, "
                  f"or `--suite {required}` added to the run):", "",
                  *[f"- {cell(v)}" for v in unchecked], ""]
    return lines


def why_unranked(board: Board, variant: str) -> str:
    """Why ``variant`` is not ranked, for the page."""
    standing, required = board.standings.get(variant), board.required_suites()
    if standing and standing.reasons:
        return ("; ".join(standing.reasons[:3]) + "; to measure it again: "
                + board.refresh_command(variant, standing.blocking_suites or required))
    if standing and set(required) & set(standing.stale):
        return (f"its {' and '.join(standing.stale)} rows measured an older source and are left off; "
                f"measure them again with: {board.refresh_command(variant, standing.stale)}")
    return (f"the {' and '.join(required)} suite has not run on it with these settings; run it with: "
            + board.refresh_command(variant, required))


def stale_lines(board: Board) -> list[str]:
    """README's account of the rows left off because their variant's source changed after they were measured:
    per variant, the suites and runs, and the command that measures them again."""
    from .board import cell

    stale = {variant: found for variant in board.variants if (found := board.stale(variant))}
    if not stale:
        return []
    lines = ["### Results of an older source, left off this board", "",
             "These variants' source changed after the suites named ran on it, so those rows neither rank nor block "
             "them; the command beside each measures them again on the current source:", ""]
    for variant, found in stale.items():
        where = "; ".join(f"{suite} (run {', '.join(runs)})" for suite, runs in found.items())
        lines.append(f"- **{cell(variant)}**: {where}: {board.refresh_command(variant, list(found), markdown=True)}")
    return lines + [""]
