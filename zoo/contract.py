"""The attention-variant contract: what a plugin registers and what the harness relies on.

A variant is plain data (:class:`Variant`) plus three callables: a factory that builds the fast
``nn.Module``, a float64 reference of the same math, and optional baselines (other implementations of
the same math, e.g. the torch module people would otherwise use). The harness decides what to check
from the capability :class:`Tags`, never from the name.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
"""Variant names: lower-case letters and digits, words joined by '-' or '_' (e.g. ``multi-head``)."""

RESERVED_OPTIONS = {
    "d_model": "factory, flops and decoder.state_bytes", "num_heads": "factory, flops and decoder.state_bytes",
    "batch": "flops and decoder.state_bytes", "q_len": "flops", "k_len": "flops", "context": "decoder.state_bytes",
    "itemsize": "decoder.state_bytes", "variant": "zoo.build and the quality suite's models", "name": "zoo.create",
    "registry": "zoo.create",
}
"""The names the harness passes beside a variant's options (name -> the callables it is passed to): an option
of one of these names would reach those callables twice, so it is refused at registration."""

SDPA = "torch-sdpa"
MHA = "torch-mha-layer"
COMPARATORS = {"core": SDPA, "layer": MHA}
"""The callable each kind of variant (:attr:`Variant.kind`) is ranked against, timed on the same shapes:
the one place these names are defined (the speed suite's ratio rows name them in ``versus``)."""
COMPARATOR_LABELS = {SDPA: "torch SDPA", MHA: "nn.MultiheadAttention"}
BEST_KNOWN_SLACK = 1.05
"""A variant whose time or memory is more than this many times its best known implementation's is flagged."""
SOFTMAX = "softmax"
"""What :attr:`Variant.approximates` names for softmax attention (scale 1/sqrt(d_head), SDPA's masks)."""


class ZooError(Exception):
    """Base class of the errors the zoo raises on purpose (the CLI prints them as one line)."""


class RegistrationError(ZooError):
    """A plugin registered something that breaks the contract."""


class UnknownVariantError(ZooError, KeyError):
    """No variant with that name is registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class OptionError(ZooError, ValueError):
    """A variant was asked for with an option it does not have, or a bad value."""


class VariantInputError(ZooError, ValueError):
    """A variant was called with inputs its capabilities do not cover."""


class VariantOutputError(ZooError, ValueError):
    """A variant returned something that breaks the calling convention (shape, dtype, device, NaN)."""


@dataclass(frozen=True)
class Tags:
    """Capabilities of a variant; the harness picks checks and input shapes from these.

    The defaults describe plain softmax attention over already-projected inputs.
    """

    accepts_attn_mask: bool = True
    """Takes a boolean ``attn_mask`` (True = may attend), broadcastable to (batch, heads, q_len, k_len)."""
    supports_causal: bool = True
    """Takes ``is_causal=True`` (query i sees keys j <= i, top-left aligned like torch SDPA)."""
    causal_only: bool = False
    """Computes only its causal form (a forgetting gate, a recurrence read left to right, a streaming window with
    sinks): it is always called with ``is_causal=True``, so every suite measures it causal and it is ranked in
    causal mode beside the others' non-causal figures, each against the op its kind is compared with in the same
    mode. Needs ``supports_causal`` and ``key_order_invariant=False``."""
    allows_different_lengths: bool = True
    """q_len may differ from k_len (cross-attention over a context)."""
    allows_kv_dims: bool = False
    """Key and value feature sizes may differ from d_model; the factory then takes ``kdim``/``vdim``."""
    exact: bool | None = None
    """Deprecated: say what a variant approximates with :attr:`Variant.approximates` (``exact=False``
    meant ``approximates="softmax"``; ``exact=True`` is the default, approximates nothing)."""
    key_order_invariant: bool = True
    """Permuting the key/value pairs together leaves the output unchanged (no positional structure);
    it also gates the query-permutation check."""
    has_parameters: bool = False
    """Has learnable parameters (gradcheck then covers them too)."""

    def __post_init__(self) -> None:
        if self.exact is not None:
            warnings.warn(f"zoo.Tags(exact={self.exact!r}) is deprecated and goes in the next release: "
                          + ("write zoo.Variant(..., approximates='softmax')" if self.exact is False else
                             "leave it out (a variant is exact for its own function unless it sets approximates=)"),
                          DeprecationWarning, stacklevel=3)

    def describe(self) -> dict[str, bool]:
        """Every capability and whether the variant has it."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "exact"}

    @property
    def modes(self) -> tuple[str, ...]:
        """The attention modes the variant computes: 'full' (non-causal) and 'causal', as its tags allow."""
        if self.causal_only:
            return ("causal",)
        return ("full", "causal") if self.supports_causal else ("full",)

    @property
    def primary_mode(self) -> str:
        """The mode the variant is measured against the others in: 'full' unless it computes only 'causal'."""
        return self.modes[0]


@dataclass(frozen=True)
class Complexity:
    """Claimed growth with sequence length n, as exponents (2 = quadratic), at fixed width/window."""

    time: float
    memory: float

    def __post_init__(self) -> None:
        for name in ("time", "memory"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 4:
                raise RegistrationError(f"complexity.{name} must be a number in (0, 4], got {value!r}")


@dataclass(frozen=True)
class Target:
    """A goal a plugin sets for itself, judged by the leaderboard against measured rows.

    Met when every measured value of ``check`` (in ``mode``/``phase``, at ``n`` or at every measured n
    when ``n`` is None; ``versus``: its rows about that callable, e.g. ``Target("time-ratio", 1.05, versus="torch-sdpa")``
    for the time ratio to torch SDPA; ``batch``: its rows at that batch size, where a suite measures several) is at
    most ``at_most`` and at least ``at_least`` (give one or both: a
    time ratio wants an upper bound, an achieved fraction of the machine's peak a lower one); "not measured"
    when the run has no such row.
    """

    check: str
    at_most: float | None = None
    mode: str = "full"
    phase: str = "fwd"
    n: int | None = None
    note: str = ""
    at_least: float | None = None
    versus: str = ""
    batch: int | None = None

    def __post_init__(self) -> None:
        for name in ("at_most", "at_least"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise RegistrationError(f"target {self.check!r}: {name} must be a finite number, got {value!r}")
        if self.at_most is None and self.at_least is None:
            raise RegistrationError(f"target {self.check!r}: give at_most, at_least or both")
        if self.at_most is not None and self.at_least is not None and self.at_least > self.at_most:
            raise RegistrationError(f"target {self.check!r}: at_least {self.at_least!r} is above at_most {self.at_most!r}")

    def bound(self) -> str:
        """The goal in words, as the board and `zoo show` give it: "at most 3", "at least 0.4", "0.4 to 3"."""
        if self.at_most is not None and self.at_least is not None:
            return f"{self.at_least:.3g} to {self.at_most:.3g}"
        return f"at most {self.at_most:.3g}" if self.at_most is not None else f"at least {self.at_least:.3g}"

    def met_by(self, value: float) -> bool:
        """Whether a measured value meets the target's bounds."""
        return ((self.at_most is None or value <= self.at_most)
                and (self.at_least is None or value >= self.at_least))

    def missed_by(self, low: float, high: float) -> bool:
        """Whether no value between ``low`` and ``high`` (a figure's interval) meets the target's bounds."""
        return (self.at_most is not None and low > self.at_most) or (self.at_least is not None and high < self.at_least)


DEPARTURE_KINDS = {
    "convention": "a layout or convention the paper writes another way (equivalent after rearranging weights)",
    "omission": "a part of the paper's method not implemented",
    "substitution": "something of the paper replaced by something else",
    "extension": "beyond the paper (a mode or input the paper does not define)",
}
"""What a :class:`Departure` can be, and what each kind means (the page and CONTRIBUTING list them)."""


@dataclass(frozen=True)
class Departure:
    """One way the implementation differs from the method of the paper it cites, stated by the plugin: the checks
    compare a variant with its own reference, so a reader learns what it leaves out or changes only from this."""

    kind: str
    """One of :data:`DEPARTURE_KINDS`."""
    text: str
    """One line for a reader choosing a variant, e.g. "pairs (x_i, x_{i+d/2}) rotate together ('rotate half')"."""

    def __post_init__(self) -> None:
        if self.kind not in DEPARTURE_KINDS:
            raise RegistrationError(f"departure kind {self.kind!r} is not one of {', '.join(DEPARTURE_KINDS)}")
        if not isinstance(self.text, str) or not self.text.strip() or "\n" in self.text:
            raise RegistrationError(f"departure text must be one non-empty line, got {self.text!r}")


@dataclass(frozen=True)
class RandomFeatures:
    """The variant estimates a kernel with random features drawn when its module is built (FAVOR+, random Fourier
    features): one module's estimate may err, but over independent draws its mean must be the kernel, and its
    directions must be isotropic. The correctness suite checks both over many freshly built modules.

    ``features(module, x)``: the unstabilised feature map in float64 of x (batch, heads, seq, d_head), as
    (batch, heads, seq, features); phi(q) . phi(k) estimates ``kernel(q, k)``.
    ``kernel(q, k)``: the exact kernel on (batch, heads, seq, d_head) pairs, as (batch, heads, q_len, k_len);
    None: softmax's, exp(q . k / sqrt(d_head)).
    ``directions(module)``: the random projection's rows, (heads, features, d_head), each of which should point
    in a uniformly random direction (their norms may follow any law); None: not tested.
    """

    features: Callable[[Any, Any], Any]
    kernel: Callable[[Any, Any], Any] | None = None
    directions: Callable[[Any], Any] | None = None

    def validate(self, name: str) -> None:
        """Raise :class:`RegistrationError` unless ``features`` is callable and the others callable or None."""
        for attr in ("features", "kernel", "directions"):
            value = getattr(self, attr)
            optional = attr != "features"
            if not callable(value) and not (optional and value is None):
                raise RegistrationError(f"variant {name!r}: random_features.{attr} must be callable")


Baseline = Callable[[Any], Callable[..., Any]]
"""Given the variant's module, return ``fn(query, key, value, attn_mask=None, is_causal=False)``."""


QUALITY_MODEL_ARGUMENTS = frozenset({"max_len", "causal", "cross", "ff_mult", "vocab", "classes", "layers",
                                     "image_size", "patch_size", "channels"})
"""Arguments of the quality suite's models (zoo.blocks), which take a variant's other options as keywords."""


def _takes_the_module(variant: str, kind: str, label: str, make) -> None:
    """Refuse a baseline, floor or peer that cannot be called as ``make(module)``, naming it: a class (it would
    be built with the module as its first argument) or a function of another number of arguments."""
    import inspect

    usage = "make(module) -> fn(query, key, value, attn_mask=None, is_causal=False)"
    if inspect.isclass(make):
        raise RegistrationError(f"variant {variant!r}: {kind} {label!r} is the class {make.__name__}; a {kind} is "
                                f"{usage} (e.g. lambda module: {make.__name__}(...) built from the module)")
    try:
        signature = inspect.signature(make)
    except (TypeError, ValueError):  # a builtin without a signature: it is tried when called
        return
    try:
        signature.bind(object())
    except TypeError:
        raise RegistrationError(f"variant {variant!r}: {kind} {label!r} has the signature {signature}, but a {kind} "
                                f"is called with the variant's module alone: {usage}") from None


FLOPS_ARGUMENTS = ("batch", "q_len", "k_len", "d_model", "num_heads")
"""The keywords a FLOP formula is called with, the variant's options beside them."""


def _counts_flops(variant: str, flops, options: Mapping[str, Any]) -> None:
    """Refuse a FLOP formula the suites cannot call, naming it: the complexity suite's check of it against the
    counted FLOPs would otherwise be an error row, and the variant unranked, on every board."""
    import inspect

    usage = f"flops({', '.join(f'{name}=' for name in FLOPS_ARGUMENTS)}, **options) -> FLOPs of one forward"
    if not callable(flops):
        raise RegistrationError(f"variant {variant!r}: flops must be callable: {usage}")
    try:
        signature = inspect.signature(flops)
    except (TypeError, ValueError):  # a builtin without a signature: it is tried when called
        return
    try:
        signature.bind(**dict.fromkeys(FLOPS_ARGUMENTS, 1), **options)
    except TypeError as exc:
        raise RegistrationError(f"variant {variant!r}: flops has the signature {signature}, but it is called as "
                                f"{usage} ({exc})") from None


@dataclass(frozen=True)
class Variant:
    """One registered attention variant.

    ``factory(d_model=..., num_heads=..., **options)`` returns the ``nn.Module``, called as
    ``module(query, key, value, attn_mask=None, is_causal=False)`` on batch-first tensors.
    ``reference(module, query, key, value, attn_mask=None, is_causal=False)`` computes the same math
    in float64, slowly and obviously, using the module's parameters.
    ``baselines`` maps a label to another implementation of the same math (see :data:`Baseline`):
    the correctness suite checks the variant equals it, the speed suite times it beside the variant.
    ``floors`` maps a label to the op the variant cannot avoid (see :data:`Baseline`; e.g. the bare tanh over
    every (query, key, feature) triple of additive attention): timed beside the variant in the forward pass
    as a lower bound, never checked for equality; a :class:`Target` on ``time-ratio`` versus the label says how close it gets.
    ``peers`` maps a label to another library's implementation of the same function that a user would
    otherwise pick (see :data:`Baseline`; e.g. compiled FlexAttention for a sliding window): timed beside the
    variant in the forward pass wherever it is timed, after one untimed first call (compilation happens
    there; its time is reported on its own) whose output must agree with the variant's, or the peer is not
    timed. Not run by the correctness suite, so a peer may need a compiler; where its first call fails,
    the board says why.
    ``best_known`` names the fastest implementation of the variant's math that is known: one of its
    ``baselines`` (checked equal to it, timed in both passes, its memory counted) or the op its kind is
    compared with (``"torch-sdpa"`` for a core, ``"torch-mha-layer"`` for a layer) where that op is the same math.
    The board shows the variant's time and memory ratio to it at every measured length and pass, and flags a
    ratio over :data:`BEST_KNOWN_SLACK` (the variant trails the best known implementation of its own math).
    ``error_sweeps`` maps an option of an approximation to values at which its approximation error is also
    measured (at the profile's reference length), e.g. ``{"features": (16, 64, 256, 1024)}``: the board shows
    what the option buys in accuracy.
    ``state_dials`` maps an option that sizes the decoding state to other values of it, e.g. Based's
    ``{"window": (2, 32)}``: the quality suite also trains the hardest recall task with each value (the others
    as ``quality_options``), so the recall-versus-state plot shows the trade-off the option dials (Based, Arora
    et al. 2024). Needs a decoder with ``state_bytes``.
    ``check_options`` are used on the correctness suite's small shapes so the variant's structure is
    exercised there (e.g. a window or chunk smaller than the sequence): its chunks or blocks should repeat
    within 9 positions, the length gradcheck runs at, so a backward wrong only across chunks is caught.
    ``quality_options`` are what the quality suite trains with, so the variant's structure is exercised at the
    tasks' lengths (a window, blocks or a projection shorter than their 16-144 tokens; at its defaults a
    window of 128 is dense attention there): the board shows them beside the scores. A run's ``--option``
    for the same key wins.
    ``targets`` are the plugin's own performance goals (see :class:`Target`), shown met or not.
    ``flops(batch, q_len, k_len, d_model, num_heads, **options)``, where given, is the analytic
    forward FLOP count the counted FLOPs are checked against.
    ``decoder``: how it decodes token by token with a KV cache or a recurrent state (:class:`zoo.Decoder`):
    checked against the causal forward by the correctness suite, timed by the inference suite.
    ``approximates`` names the function the variant approximates: ``"softmax"`` (:data:`SOFTMAX`) or a
    registered exact attention core's name. None (the default) means the variant is exact for its own
    documented function (e.g. windowed or sigmoid attention), so it is never measured against another.
    An approximation's error against that function is reported beside its speed, and one no better than
    the trivial answer (each query's mean of the values) is not ranked.
    ``departures``: every way the implementation differs from the cited paper (:class:`Departure`), shown by
    `zoo show` and on the variant's page; empty means it follows the paper as written.
    ``random_features``: where the variant is a random-feature estimator of a kernel (:class:`RandomFeatures`), the
    statistical checks of its draws.
    """

    name: str
    summary: str
    family: str
    citation: str
    factory: Callable[..., Any]
    reference: Callable[..., Any]
    tags: Tags = field(default_factory=Tags)
    approximates: str | None = None
    complexity: Complexity = field(default_factory=lambda: Complexity(time=2, memory=2))
    options: Mapping[str, Any] = field(default_factory=dict)
    check_options: Mapping[str, Any] = field(default_factory=dict)
    quality_options: Mapping[str, Any] = field(default_factory=dict)
    baselines: Mapping[str, Baseline] = field(default_factory=dict)
    floors: Mapping[str, Baseline] = field(default_factory=dict)
    peers: Mapping[str, Baseline] = field(default_factory=dict)
    best_known: str = ""
    error_sweeps: Mapping[str, tuple] = field(default_factory=dict)
    state_dials: Mapping[str, tuple] = field(default_factory=dict)
    flops: Callable[..., float] | None = None
    targets: tuple[Target, ...] = ()
    decoder: Any = None
    """A :class:`zoo.Decoder` where the variant's causal form can be decoded token by token (None: it cannot,
    and the capability table says why)."""
    departures: tuple[Departure, ...] = ()
    random_features: RandomFeatures | None = None
    origin: Origin | None = None
    approximated: Variant | None = field(default=None, repr=False, compare=False)
    """Set by the registry when :attr:`approximates` names a registered variant: that variant."""

    def __post_init__(self) -> None:
        if getattr(self.tags, "exact", None) is False and self.approximates is None:  # the deprecated spelling
            object.__setattr__(self, "approximates", SOFTMAX)

    def validate(self) -> None:
        """Raise :class:`RegistrationError` naming the problem; called by the registry."""
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise RegistrationError(
                f"variant name {self.name!r} does not match {NAME_PATTERN.pattern} "
                "(lower-case words joined by '-' or '_')"
            )
        for attr in ("summary", "family", "citation"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not value.strip() or "\n" in value:
                raise RegistrationError(f"variant {self.name!r}: {attr} must be one non-empty line")
        for attr in ("factory", "reference"):
            if not callable(getattr(self, attr)):
                raise RegistrationError(f"variant {self.name!r}: {attr} must be callable")
        if not isinstance(self.tags, Tags):
            raise RegistrationError(f"variant {self.name!r}: tags must be a zoo.Tags")
        if self.tags.causal_only and not self.tags.supports_causal:
            raise RegistrationError(f"variant {self.name!r}: tags.causal_only needs tags.supports_causal=True")
        if self.tags.causal_only and self.tags.key_order_invariant:
            raise RegistrationError(f"variant {self.name!r}: tags.causal_only needs tags.key_order_invariant=False "
                                    "(a causal form depends on the order of the keys)")
        if self.approximates is not None and (not isinstance(self.approximates, str)
                                              or not NAME_PATTERN.match(self.approximates)):
            raise RegistrationError(f"variant {self.name!r}: approximates must be None, {SOFTMAX!r} or a variant "
                                    f"name, got {self.approximates!r}")
        if self.approximates == self.name:
            raise RegistrationError(f"variant {self.name!r}: approximates names the variant itself")
        if not isinstance(self.complexity, Complexity):
            raise RegistrationError(f"variant {self.name!r}: complexity must be a zoo.Complexity")
        clash = sorted(set(self.options) & set(RESERVED_OPTIONS))
        if clash:
            raise RegistrationError(f"variant {self.name!r}: options may not be named {clash}: the harness passes "
                                    "these beside the options (" + "; ".join(f"{name} to {RESERVED_OPTIONS[name]}"
                                                                           for name in clash) + ")")
        if not isinstance(self.departures, tuple) or not all(isinstance(d, Departure) for d in self.departures):
            raise RegistrationError(f"variant {self.name!r}: departures must be a tuple of zoo.Departure")
        if self.random_features is not None:
            if not isinstance(self.random_features, RandomFeatures):
                raise RegistrationError(f"variant {self.name!r}: random_features must be a zoo.RandomFeatures or None")
            self.random_features.validate(self.name)
        if not all(isinstance(t, Target) for t in self.targets):
            raise RegistrationError(f"variant {self.name!r}: targets must be zoo.Target instances")
        for label, given in (("check_options", self.check_options), ("quality_options", self.quality_options)):
            unknown = sorted(set(given) - set(self.options))
            if unknown:
                raise RegistrationError(f"variant {self.name!r}: {label} {unknown} are not among its options")
        taken = sorted(set(self.quality_options) & QUALITY_MODEL_ARGUMENTS)
        if taken:
            raise RegistrationError(f"variant {self.name!r}: quality_options {taken} are arguments of the quality "
                                    "suite's own models, so they cannot be passed through to the variant")
        if self.error_sweeps and self.approximates is None:
            raise RegistrationError(f"variant {self.name!r}: error_sweeps needs approximates= (an exact variant "
                                    "has no approximation error to sweep)")
        for option, values in self.error_sweeps.items():
            if option not in self.options:
                raise RegistrationError(f"variant {self.name!r}: error_sweeps option {option!r} is not among its options")
            if not isinstance(values, (tuple, list)) or not values:
                raise RegistrationError(f"variant {self.name!r}: error_sweeps[{option!r}] must be a non-empty tuple "
                                        f"of option values, got {values!r}")
        for option, values in self.state_dials.items():
            if option not in self.options:
                raise RegistrationError(f"variant {self.name!r}: state_dials option {option!r} is not among its options")
            if not isinstance(values, (tuple, list)) or not values:
                raise RegistrationError(f"variant {self.name!r}: state_dials[{option!r}] must be a non-empty tuple "
                                        f"of option values, got {values!r}")
        if self.state_dials and (self.decoder is None or self.decoder.state_bytes is None):
            raise RegistrationError(f"variant {self.name!r}: state_dials needs a decoder with state_bytes (the state "
                                    "the dial sizes is what the plot shows)")
        if self.decoder is not None:
            from .decoding import Decoder

            if not isinstance(self.decoder, Decoder):
                raise RegistrationError(f"variant {self.name!r}: decoder must be a zoo.Decoder or None")
            if not self.tags.supports_causal and not self.decoder.context:
                raise RegistrationError(f"variant {self.name!r}: a decoder needs a causal form (tags.supports_causal)")
            self.decoder.validate(self.name)
        if self.flops is not None:  # a cross variant's formula is also asked at key and value widths of their own
            _counts_flops(self.name, self.flops, {**self.options, **(dict.fromkeys(("kdim", "vdim"), 1)
                                                                     if self.tags.allows_kv_dims else {})})
        kinds = (("baseline", self.baselines), ("floor", self.floors), ("peer", self.peers))
        for kind, labelled in kinds:
            for label, make in labelled.items():
                if not callable(make):
                    raise RegistrationError(f"variant {self.name!r}: {kind} {label!r} must be callable")
                _takes_the_module(self.name, kind, label, make)
        if self.best_known and self.best_known not in {*self.baselines, COMPARATORS[self.kind]}:
            raise RegistrationError(f"variant {self.name!r}: best_known {self.best_known!r} is neither one of its "
                                    f"baselines {sorted(self.baselines)} nor {COMPARATORS[self.kind]!r}, the op a "
                                    f"{self.kind} is compared with")
        for (kind, labelled), (other, others) in itertools.combinations(kinds, 2):
            clash = sorted(set(labelled) & set(others))
            if clash:
                raise RegistrationError(f"variant {self.name!r}: {clash} named both a {kind} and a {other}")

    @property
    def kind(self) -> str:
        """``"layer"`` (has parameters: projections around the attention, compared with
        ``nn.MultiheadAttention``) or ``"core"`` (the attention alone, compared with torch SDPA)."""
        return "layer" if self.tags.has_parameters else "core"

    def card(self) -> dict[str, Any]:
        """What the leaderboard needs to know about the variant, as plain data stored with each run."""
        from .decoding import why_not

        return {
            "summary": self.summary, "family": self.family, "citation": self.citation, "kind": self.kind,
            "tags": self.tags.describe(), "approximates": self.approximates, "claimed_time": self.complexity.time,
            "claimed_memory": self.complexity.memory, "options": {k: repr(v) for k, v in self.options.items()},
            "quality_options": {k: repr(v) for k, v in self.quality_options.items()},
            "baselines": list(self.baselines), "floors": list(self.floors), "peers": list(self.peers),
            "best_known": self.best_known,
            "targets": [dataclasses.asdict(t) for t in self.targets],
            "decoder_growth": self.decoder.growth if self.decoder is not None else None,
            "decoder_absent": why_not(self),
            "decoder_context": bool(self.decoder is not None and self.decoder.context),
            "departures": [dataclasses.asdict(d) for d in self.departures],
            "random_features": self.random_features is not None,
        }

    def with_defaults(self, overrides: Mapping[str, Any]) -> "Variant":
        """This variant with new option defaults, taking only the overrides it has an option for (and its
        quality options dropping those keys)."""
        mine = {k: v for k, v in overrides.items() if k in self.options}
        quality = {k: v for k, v in self.quality_options.items() if k not in mine}  # the run's option wins
        return dataclasses.replace(self, options={**self.options, **mine}, quality_options=quality) if mine else self

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The variant's defaults overridden by ``options``; unknown names are rejected by name."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise OptionError(
                f"variant {self.name!r} has no option {', '.join(map(repr, unknown))} (its options: {known})"
            )
        return {**self.options, **options}


@dataclass(frozen=True)
class Origin:
    """Where a variant (or check) came from, for provenance in `zoo plugins` and every result row."""

    plugin: str
    kind: str  # "builtin", "entrypoint" or "file"
    location: str  # module name, or file path
    distribution: str | None = None
    version: str | None = None

    def label(self) -> str:
        """Where a plugin came from, for messages ('name (kind: location)')."""
        if self.distribution:
            return f"{self.plugin} ({self.distribution} {self.version})"
        return f"{self.plugin} ({self.kind}: {self.location})"
