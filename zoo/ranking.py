"""Ranking: which variants may be ranked (the gate, from each suite's blocking rules) and in what order (the
figure of the one suite that ranks), shared by README.md, the page, ``zoo leaderboard --by device`` and the
summary a run ends with.

A variant is ranked only when every ``required`` suite ran on its current source and passed, and none of its
rows has a status its suite says blocks (an ``error`` in any suite always does). Rows of an older source are not
on the board (:mod:`zoo.board`): they neither rank a variant nor block it, and its standing names them. Within its kind (cores, layers: like is compared with like), ranked
variants are ordered by the ranking figure, lower first; one without a figure comes last, with the reason. Places
whose figures' intervals overlap are tied: they share a rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .board import KIND_TITLES, Board, checked_by, origin_text, runs_text
from .checks import FAILED
from .suite import Suite, implicit_suite


@dataclass
class Standing:
    """Whether a variant may be ranked: the required suites ran on the code that was measured, and nothing
    blocking happened (``reasons``: each blocking row, and a source that changed between runs)."""

    checked: bool
    reasons: list[str] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)  # the suites whose rows block it
    stale: list[str] = field(default_factory=list)  # the suites whose rows measured an older source (dropped)

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
        blocking = rows[[rules[r.suite].blocks(r.status) for r in rows.itertuples()]]
        checked = all(checked_by(rows, name) for name in required) and bool(required)
        reasons = [f"{r.suite}/{r.check}: {r.detail or r.status}" + (f" [{r.setting}]" if r.setting else "")
                   for r in blocking.itertuples()]
        blocked_by = sorted(set(blocking[blocking.status == FAILED].suite))
        standings[variant] = Standing(checked, reasons, blocked_by, list(stale.get(variant, [])))
    for variant in set(stale) - set(standings):  # every row it has is of an older source
        standings[variant] = Standing(False, stale=list(stale[variant]))
    return standings


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
            "with no error in any suite (NaN or inf outputs included).")


def ranked_tables(board: Board) -> tuple[dict[str, list[dict]], list[str]]:
    """The ranked rows of each kind ({kind: [row, ...]}, best first, each with its rank) and the variants not
    ranked: the ranking suite's columns first, then each other suite's in board order."""
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
            row = {"variant": variant, "family": board.card(variant).get("family")}
            for suite in suites:
                if suite.columns:
                    row.update(suite.columns(board, variant))
            row["origin"] = origin_text(board.cards[variant])
            row["from"] = runs_text(board.results[board.results.variant == variant].run_id, board.run_id)
            figure = board.rank_figure(variant)
            ranked.append((float("inf") if figure is None or figure.value is None else figure.value, row, figure))
        ranked.sort(key=lambda item: item[0])
        tables[kind] = [{"rank": place, **row} for place, (_, row, _) in zip(places([f for *_, f in ranked]), ranked)]
    return tables, unranked


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
    standing = board.standings.get(variant)
    if standing and standing.reasons:
        return "; ".join(standing.reasons[:3])
    if standing and set(board.required_suites()) & set(standing.stale):
        return (f"its {' and '.join(standing.stale)} rows measured an older source and are left off; "
                f"measure them again with: {board.refresh_command(variant, standing.stale)}")
    return f"the {' and '.join(board.required_suites())} suite has not run on it with these settings"


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
