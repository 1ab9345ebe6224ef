"""The suite contract: what a suite plugin registers, and all the harness and the board know of it.

A suite is registered through the ``zoo_register_suites`` hook (the built-in suites in ``zoo/suites/`` exactly as
a third party's) and its checks through ``zoo_register_checks``, each naming the suite. The :class:`Suite` says
what the suite is for, the kinds of rows its checks yield (:class:`Measure`), which of its outcomes keep a variant
out of the ranking, whether ranking needs it to have run, in which profiles it runs unless ``--suite`` chooses,
and how the board shows it: its section (:class:`Section`, drawn from its rows alone), its columns in the ranked
tables and, for the one suite that ranks, the figure variants are ranked by. Nothing outside a suite's own module
names the suite or its checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from .checks import ERROR, ROW_FORM, STATUSES
from .contract import NAME_PATTERN, RegistrationError

if TYPE_CHECKING:
    import pandas as pd

    from .checks import Check

    from .board import Board
    from .contract import Origin


@dataclass(frozen=True)
class Measure:
    """A kind of row a suite's checks yield: its ``check`` name, what it measures or decides, and its unit."""

    name: str
    summary: str
    unit: str = ""


@dataclass(frozen=True)
class Table:
    """A table of a board section, shown in README.md and on the page: a title (none: the section's first),
    ``note`` (paragraphs before it), its rows (dicts of text or numbers; ``columns``: their order, else the
    rows') and ``footnotes`` (numbered reasons for its empty cells, after it)."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    note: list[str] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    """A suite's part of the board: a heading, paragraphs, tables and plots (file name -> PNG bytes)."""

    title: str
    text: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: dict[str, bytes] = field(default_factory=dict)


def generic_section(suite: "Suite", board: "Board") -> Section:
    """A suite that draws no section of its own: its measurements and its verdicts, from its rows alone."""
    from .checks import MEASURED

    rows = board.rows(suite.name)
    if rows.empty:
        return Section(suite.name.capitalize(), [f"_Not on this board: `zoo run-all --suite {suite.name}` runs it "
                                                 f"({suite.summary.rstrip('.')})._"])
    measured = rows[rows.status == MEASURED]
    verdicts = rows[rows.status != MEASURED]
    counts = [{"variant": variant, **{status: int((group.status == status).sum()) for status in STATUSES
                                      if status != MEASURED and (verdicts.status == status).any()}}
              for variant, group in verdicts.groupby("variant")]
    values = [{"variant": r.variant, "check": r.check, **({"versus": r.versus} if measured.versus.any() else {}),
               "setting": r.setting, "value": r.value, "unit": r.unit, "detail": r.detail} for r in measured.itertuples()]
    return Section(suite.name.capitalize(), [f"{suite.summary.rstrip('.')}. From {board.source_text(suite.name)}."],
                   [table for table in (Table("Verdicts", [], counts), Table("Measurements", [], values)) if table.rows])


@dataclass(frozen=True)
class RankFigure:
    """What a variant is ranked by (lower is better): the column it is shown under, its value (None: it has none,
    and is listed last), the cell's text (the figure, or why there is none) and the interval the value is uncertain
    over (``low``-``high``; None: not known): places whose intervals overlap are declared tied."""

    column: str
    value: float | None
    text: str
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Axis:
    """One figure a reader weighs a variant on when choosing (typed, never read back from a cell's text): its
    ``name`` (the same for every variant), ``value`` (None: not measured), which way is ``better`` ("lower" or
    "higher") and the ``text`` the board shows. ``use``: the question it answers when it is a reason to choose
    (e.g. "decoding"); '' for a cost weighed against those (error, quality). The board puts each variant on or
    off the Pareto front of its kind's axes and answers "which should I use?" from them."""

    name: str
    value: float | None
    better: str
    text: str
    use: str = ""
    tie: float = 0.0  # a difference no larger than this is no difference (a fitted exponent's, a score's noise)
    ceiling: float | None = None  # a cost beyond which the variant is not offered as an answer, whatever its speed
    keep: float | None = None  # a cost a reader may hold the answer to: also offer the best within this of the top
    low: float | None = None  # the interval the value is uncertain over (a timing's), where it states one
    high: float | None = None

    def beats(self, other: "Axis") -> bool:
        """Better than ``other`` by more than ``tie`` (both measured), and apart from it where both state an
        interval: overlapping intervals are tied, as the ranking ties them."""
        margin = other.value - self.value if self.better == "lower" else self.value - other.value
        return margin > self.tie and not self.overlaps(other)

    def overlaps(self, other: "Axis") -> bool:
        """Whether both state an interval and the two overlap."""
        ends = (self.low, self.high, other.low, other.high)
        return None not in ends and self.low <= other.high and other.low <= self.high

    def admits(self) -> bool:
        """Whether a variant with this figure may be offered as an answer to "which should I use?": a figure with a
        ``ceiling`` must be measured and at most that (an approximation whose error is unknown or too large is not
        a recommendation, however fast)."""
        return self.ceiling is None or (self.value is not None and self.value <= self.ceiling)


@dataclass(frozen=True)
class Ranking:
    """How the one suite that ranks orders the variants: ``figure(board, variant)`` is the :class:`RankFigure`,
    ``intro(board)`` the paragraphs that say what the figure compares, under the board's ranking heading."""

    figure: Callable[["Board", str], RankFigure]
    intro: Callable[["Board"], list[str]]


@dataclass(frozen=True)
class Suite:
    """A suite of checks, as the harness runs it and the board shows it.

    ``settings``: the suite's settings and their defaults, nested in a run's profile under its name (its checks
    read them as ``profile.of(name)``); ``presets``: per profile name, the settings it changes there (the full
    profile's longer lengths); ``legacy``: the flat profile keys of runs stored before settings were nested,
    and the setting each was; ``settle(settings)``: the settings made consistent (or ValueError saying why).
    ``blocking``: statuses of the suite's rows that keep a variant out of the ranking (an ``error`` anywhere
    always does). ``required``: a variant is ranked only when this suite ran on the measured source and passed
    (the correctness suite). ``profiles``: the profiles it runs in when ``--suite`` is not given (None: every
    one). ``carried``: a variant with no rows of this suite on its current source among the runs the board
    accumulates shows its latest such rows from any run, labelled with their run (a suite too slow for the default
    profile, whose figures do not hang on the machine that trained them). ``side_by_side``: its checks time nothing
    and its verdicts do not hang on the thread count, so a local run runs its jobs two at a time, before the timed
    ones, each worker with half the run's threads (correctness and complexity; a suite that times, or trains with
    the run's threads, runs its jobs alone). ``order``: where its
    section comes on the board (smaller first; the built-ins use 10 to 40). ``section(board)``
    returns its :class:`Section` (None: a generic table of its rows); ``columns(board, variant)`` its cells in
    a ranked row; ``details(board, variant)`` tables for the variant's page; ``ranking``: how the one suite
    that ranks orders the variants (:class:`Ranking`). Each reads the :class:`zoo.board.Board`.
    ``axes(board, variant)``: the :class:`Axis` figures a reader weighs the variant on, from this suite.
    ``noise(rows)``: the relative spread of each cell the suite timed, from its rows of one run, as a Series
    indexed by cell (what a rerun would see move): a run whose cells spread far more than the board's is held back
    instead of written over it (:func:`zoo.leaderboard.board_run`).
    ``upgrade(row)``: a row an older zoo stored (a dict of the result columns, and ``form``: the form its run
    stored rows in, an int below :data:`zoo.checks.ROW_FORM`), as the suite's rows are today (:func:`legacy_names`
    does the usual case): the board, ``zoo compare`` and the targets read stored rows so.
    """

    name: str
    summary: str
    measures: tuple[Measure, ...] = ()
    blocking: tuple[str, ...] = (ERROR,)
    required: bool = False
    profiles: tuple[str, ...] | None = None
    carried: bool = False
    side_by_side: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    legacy: Mapping[str, str] = field(default_factory=dict)
    settle: Callable[[dict], dict] | None = None
    section: Callable[["Board"], Section | None] | None = None
    columns: Callable[["Board", str], dict[str, Any]] | None = None
    details: Callable[["Board", str], list[Table]] | None = None
    ranking: Ranking | None = None
    upgrade: Callable[[dict], dict] | None = None
    noise: Callable[[Any], Any] | None = None
    axes: Callable[["Board", str], list[Axis]] | None = None
    order: int = 100
    origin: "Origin | None" = None

    def validate(self) -> None:
        """Refuse what the harness could not use (a bad name, an unknown status, a preset of unknown settings)."""
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise RegistrationError(f"suite name {self.name!r} does not match {NAME_PATTERN.pattern}")
        if not isinstance(self.summary, str) or not self.summary.strip():
            raise RegistrationError(f"suite {self.name!r}: summary must be a non-empty string")
        unknown = [s for s in self.blocking if s not in STATUSES]
        if unknown:
            raise RegistrationError(f"suite {self.name!r}: blocking statuses {unknown} are not among {STATUSES}")
        if self.ranking is not None and not isinstance(self.ranking, Ranking):
            raise RegistrationError(f"suite {self.name!r}: ranking must be a zoo.Ranking")
        for attr in ("section", "columns", "details", "upgrade", "noise", "axes"):
            if getattr(self, attr) is not None and not callable(getattr(self, attr)):
                raise RegistrationError(f"suite {self.name!r}: {attr} must be callable")
        for profile, preset in self.presets.items():
            unknown = sorted(set(preset) - set(self.settings))
            if unknown:
                raise RegistrationError(f"suite {self.name!r}: its {profile!r} preset sets {unknown}, which are not "
                                        f"among its settings ({', '.join(self.settings) or 'none'})")
        if self.settle is not None and not callable(self.settle):
            raise RegistrationError(f"suite {self.name!r}: settle must be callable")
        if not all(isinstance(m, Measure) for m in self.measures):
            raise RegistrationError(f"suite {self.name!r}: measures must be zoo.Measure objects")

    def runs_in(self, profile: str) -> bool:
        """Whether the suite runs in ``profile`` when ``--suite`` does not choose."""
        return self.profiles is None or profile in self.profiles

    def row_kinds(self, checks: Iterable["Check"]) -> frozenset[str] | None:
        """The kinds of row this suite's ``checks`` may yield: its measures and each check's own name (its
        verdict or its error); None for a suite that declares no measures (nothing to hold its rows to)."""
        if not self.measures:
            return None
        return frozenset(m.name for m in self.measures) | {c.name for c in checks if c.suite == self.name}

    def blocks(self, status: str) -> bool:
        """Whether a row of this status keeps its variant out of the ranking."""
        return status == ERROR or status in self.blocking


def legacy_names(row: dict, templates: Mapping[str, str], current: Iterable[str]) -> dict:
    """``row`` with a name built the old way split into its kind and ``versus``: before rows had a ``versus``
    field, a ratio to SDPA was stored as check ``x-torch-sdpa``; with ``templates`` {"time-ratio": "x-{}"} it
    becomes check ``time-ratio``, versus ``torch-sdpa``. A name among ``current`` (today's kinds) or a row with
    a ``versus``, or one stored in a form that had ``versus`` (2 on), is left as it is."""
    if row.get("versus") or row.get("form", 1) >= 2 or row["check"] in set(current):
        return row
    for kind, template in templates.items():
        before, _, after = template.partition("{}")
        match = re.fullmatch(re.escape(before) + "(.+)" + re.escape(after), row["check"])
        if match:
            return {**row, "check": kind, "versus": match.group(1)}
    return row


def upgrade_rows(rows: "pd.DataFrame", suites: Mapping[str, "Suite"], environments: Mapping[str, dict]) -> "pd.DataFrame":
    """Stored rows as their suites' rows are today (each suite's ``upgrade``), in the order they came: only the
    rows of runs stored in an older form (``environments``: each run's, by id; see :data:`zoo.checks.ROW_FORM`),
    so a row of today's form is never renamed, whatever its name."""
    rows = rows.copy()
    forms = {run: _row_form(environment) for run, environment in environments.items()}
    old = {run for run, form in forms.items() if form < int(ROW_FORM)}
    before = rows["run_id"].isin(old).to_numpy() if "run_id" in rows and not rows.empty else None
    for name, suite in suites.items():
        mine = (rows["suite"] == name).to_numpy() & before if suite.upgrade and before is not None else None
        if mine is None or not mine.any():
            continue
        upgraded = [suite.upgrade({**row, "form": forms[row["run_id"]]})
                    for row in rows.loc[mine].to_dict("records")]
        for column in ("check", "versus", "params"):
            rows[column] = rows[column].astype(object)  # a dict (params) or text may replace what was there
            rows.loc[mine, column] = _object_column([row.get(column) for row in upgraded], rows.index[mine])
    return rows


def _row_form(environment: Mapping) -> int:
    """The form a run's rows were stored in (1: before forms were recorded, or not a number)."""
    form = str(environment.get("row_form", "1"))
    return int(form) if form.isdigit() else 1


def upgrade_name(check: str, suites: Mapping[str, "Suite"]) -> tuple[str, str]:
    """(check, versus) of a row an older zoo named ``check`` (what a target it recorded names), by the first suite
    whose ``upgrade`` renames it; unchanged when none does."""
    for suite in suites.values():
        if suite.upgrade:
            row = suite.upgrade({"check": check, "versus": "", "setting": "", "params": None, "suite": suite.name,
                                 "form": 1})
            if row["check"] != check:
                return row["check"], row.get("versus", "")
    return check, ""


def _object_column(values: list, index) -> "pd.Series":
    """Values (dicts too) as one object column over ``index``."""
    import pandas as pd

    return pd.Series(values, index=index, dtype=object)


def implicit_suite(name: str) -> Suite:
    """The suite of checks that name a suite no plugin registered (checks registered before suites were)."""
    return Suite(name, f"checks registered for {name!r} (no zoo.Suite describes it)")
