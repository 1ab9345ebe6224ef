"""The check contract: what a suite registers and the result rows it yields."""

from __future__ import annotations

import enum
import traceback
from dataclasses import asdict, dataclass, field, fields
import math
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Mapping

from .contract import MHA, NAME_PATTERN, RegistrationError

if TYPE_CHECKING:
    from .contract import Origin, Tags, Variant
    from .profiles import Profile



class Status(str, enum.Enum):
    """What a result row is: a verdict (passed/failed/skipped/error) or a measurement. A ``str`` enum,
    so rows compare equal to the plain strings stored in the database and written to results.csv."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    ERROR = "error"
    MEASURED = "measured"

    def __str__(self) -> str:
        return self.value


PASSED, FAILED, SKIPPED, ERROR, MEASURED = Status
STATUSES = tuple(s.value for s in Status)
BAD = (FAILED.value, ERROR.value)
"""Statuses that keep a variant off the ranking when they occur in its correctness rows (errors: anywhere)."""
WORKER_CHECK = "worker"  # the row of a job its worker did not finish (a timeout, a crash): no check's own result


@dataclass
class Result:
    """One tidy row: a verdict (passed/failed/skipped/error) or a measurement (measured).

    What a row is about is typed: ``check`` is the kind of row (a :class:`zoo.Measure` of its suite), ``versus``
    the callable it compares with or measures instead of the variant (empty: the variant itself), ``params``
    named values it was measured at beyond ``n``/``mode``/``phase`` (a correctness case's shape, a swept
    option); ``low``/``high`` the interval its value is uncertain over (a timing's, across processes and rounds),
    which ranks and ``zoo compare`` read; ``batch`` the batch size, where a suite measures at several. ``setting`` and ``detail`` are for people; nothing reads them back."""

    check: str
    status: str
    setting: str = ""
    value: float | None = None
    unit: str = ""
    detail: str = ""
    n: int | None = None  # what a measure runs over: the sequence length (pairs for the recall-vs-pairs curve)
    mode: str = ""  # "full" or "causal"
    phase: str = ""  # "fwd" or "fwd+bwd"
    samples: list[float] | None = None  # per-round measurements behind ``value`` (timings), for `zoo compare`
    versus: str = ""  # the other callable the row is about: a ratio's denominator, or whose time/count/plan it is
    params: dict[str, Any] | None = None  # what else the row was measured at, by name: a case's shape, an option
    low: float | None = None  # the interval ``value`` is uncertain over: where a rerun's figure is expected (timings)
    high: float | None = None
    batch: int | None = None  # the batch size it was measured at, where a suite measures several (inference)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"result status must be one of {STATUSES}, got {self.status!r}")
        self.status = Status(self.status).value
        if self.params is not None:
            if not isinstance(self.params, Mapping):
                raise ValueError(f"result params must be a mapping of names to values, got {self.params!r}")
            self.params = {str(key): _scalar(value) for key, value in self.params.items()}

    def as_dict(self) -> dict[str, Any]:
        """The row as plain data (what the worker sends and the store keeps)."""
        return asdict(self)


RESULT_FIELDS = [f.name for f in fields(Result)]
"""The result schema, in one place: the store's columns and results.csv follow it (plus the variant and suite)."""
ROW_FORM = "3"
"""How a run's rows say what they are about, recorded in its environment as ``row_form``: "3", in ``versus`` and
``params`` (the quality suite's task too); "2" named the task only in the setting; a run without it (1) built the
other callable into the check name (``x-torch-sdpa``). Rows of runs of an older form are read through each
suite's ``upgrade``; rows of runs of this form never are."""
TIMING_FORM = "2"
"""How the harness calls what it times, recorded in a run's environment as ``timing_form``; raised when a change to
a comparator or to a helper the built-ins time through (``zoo.functional``) makes a figure no longer the one earlier
runs measured: "2", nn.MultiheadAttention is told ``is_causal`` for a causal call (it ran masked SDPA over the whole
square before); a run without it: 1, unless it ran on a commit that had already changed it
(:data:`zoo.environment.UNRECORDED_TIMING_FORMS`). A figure's interval spans the same figure of earlier runs only
of its form, and ``zoo compare`` names a difference; :data:`TIMING_FORM_CHANGES` says which calls each form changed."""


@dataclass(frozen=True)
class TimingFormChange:
    """What a form of :data:`TIMING_FORM` changed: how the comparator ``versus`` is called in ``mode`` (``now``;
    ``before``, in runs of earlier forms); ``also``: what else times that call, so changed with it, in words."""

    versus: str
    mode: str
    now: str
    before: str
    also: str = ""


TIMING_FORM_CHANGES: dict[str, tuple[TimingFormChange, ...]] = {
    "2": (TimingFormChange(MHA, "causal", "nn.MultiheadAttention is told is_causal, so it runs torch's causal kernel",
                           "it was handed the causal mask alone, so it ran masked SDPA over the whole square",
                           "baselines built by zoo.functional.torch_mha_baseline with need_weights=False"),),
}
"""Form -> the calls it changed (every form after "1" changed at least one)."""


def form_changes(form: str, versus: str, mode: str) -> list[TimingFormChange]:
    """The changes since ``form`` to the call of ``versus`` in ``mode``: a ratio to it timed in ``form`` is to
    another call than this zoo's where there are any (none for a form this zoo does not know, e.g. a fork's)."""
    if not str(form).isdigit():
        return []
    return [change for later, changes in TIMING_FORM_CHANGES.items() if int(later) > int(form)
            for change in changes if (change.versus, change.mode) == (versus, mode)]


@dataclass(frozen=True)
class Check:
    """A named check or measure in a suite.

    ``applies(tags)`` returns None when the check applies, else the reason it is skipped.
    ``run(variant, profile)`` yields :class:`Result` rows; an exception becomes an ``error`` row.
    ``combine(variant, profile, rows_by_process)``, for a check whose figures move between processes (timings):
    the run repeats the check in the profile's ``processes`` fresh worker processes, a pass apart, and this
    turns each process's rows (a list per process, the first process's first) into the check's rows, so a
    figure's stated uncertainty covers what a fresh process would see (see :mod:`zoo.timing`).
    """

    name: str
    suite: str
    summary: str
    run: Callable[["Variant", "Profile"], Iterable[Result]]
    applies: Callable[["Tags"], str | None] = field(default=lambda tags: None)
    origin: "Origin | None" = None
    combine: Callable[["Variant", "Profile", list[list[Result]]], Iterable[Result]] | None = None

    def validate(self) -> None:
        """Refuse a name that is not a plain name, or a run/applies that cannot be called."""
        for attr in ("name", "suite"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not NAME_PATTERN.match(value):
                raise RegistrationError(f"check {attr} {value!r} does not match {NAME_PATTERN.pattern}")
        if not callable(self.run) or not callable(self.applies):
            raise RegistrationError(f"check {self.name!r}: run and applies must be callable")
        if self.combine is not None and not callable(self.combine):
            raise RegistrationError(f"check {self.name!r}: combine must be callable (or None)")


def _scalar(value):
    """A params value as the store keeps one: a number, text or boolean (a numpy or torch scalar as its number);
    anything else (None, a tuple, a dtype, an infinity) as its repr, so a row never fails for its params."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return repr(value)


def requires(*tag_names: str) -> Callable[["Tags"], str | None]:
    """An ``applies`` predicate: the check runs only on variants with all these tags set."""

    def applies(tags: "Tags") -> str | None:
        missing = [name for name in tag_names if not getattr(tags, name)]
        return f"variant does not declare {', '.join(missing)}" if missing else None

    return applies


def run_check(check: Check, variant: "Variant", profile: "Profile", memory_limit: int | None = None,
              kinds: Collection[str] | None = None) -> list[Result]:
    """A check's rows on a variant, as the worker and ``zoo.testing`` both run it: one skipped row when
    its ``applies`` rules the variant out, and an error row for an exception (in ``applies`` too), after
    the rows it yielded before failing. ``kinds``: the row kinds its suite declares
    (:meth:`zoo.Suite.row_kinds`); each other kind it yields adds an error row naming it (the board reads rows by
    their declared kinds: an undeclared one would be stored and shown nowhere). Never raises for a plugin's
    fault."""
    rows: list[Result] = []
    try:
        reason = check.applies(variant.tags)
        if reason:
            return [Result(check.name, SKIPPED, detail=reason)]
        for row in check.run(variant, profile):
            rows.append(row)
    except Exception as exc:
        rows.append(Result(check.name, ERROR, detail=describe_exception(exc, memory_limit)))
    return rows + undeclared(check, [r.check for r in rows], kinds)


def undeclared(check: Check, yielded: Iterable, kinds: Collection[str] | None) -> list[Result]:
    """An error row for each kind among ``yielded`` (the ``check`` of each row the check gave, in a run or combined
    over its processes) that is not in ``kinds``, its suite's declared row kinds (None: not held to any)."""
    if kinds is None:
        return []
    unknown = dict.fromkeys(repr(kind) for kind in yielded if not isinstance(kind, str) or kind not in kinds)
    return [Result(check.name, ERROR, detail=f"check {check.name!r} yielded rows of kind {kind}, which its suite "
                   f"{check.suite!r} does not declare (declared: {', '.join(sorted(kinds))}): add a zoo.Measure for "
                   "it to the suite") for kind in unknown]


def describe_exception(exc: BaseException, memory_limit: int | None = None) -> str:
    """'TypeError: message (at file.py:12 in fn)': the innermost frame, for a person to act on."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    message = " ".join(str(exc).split()) or "(no message)"
    if isinstance(exc, MemoryError) or "can't allocate memory" in message:
        cap = f" of {memory_limit / 2 ** 30:.1f} GiB" if memory_limit else ""
        message = f"out of memory: an allocation went beyond the worker's memory cap{cap} (--memory-limit). " + message
    return f"{type(exc).__name__}: {message[:500]}{where}"
