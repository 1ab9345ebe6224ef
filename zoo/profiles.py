"""Run profiles: what a run is held to as a whole (``quick`` is the default), and each suite's settings in it.

A profile has the settings of the run itself (seed, device, threads, dtype, the per-variant time limit, variant
options) and, nested under each suite's name, that suite's settings: its defaults (:attr:`zoo.Suite.settings`),
its preset for the profile (:attr:`zoo.Suite.presets`), then the run's own overrides (``--set SUITE.KEY=VALUE``
and the shorthands). A key a suite does not declare is an error naming the suite and the key. A run records
its resolved profile, so its workers need no registry to read it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Mapping

from .contract import OptionError

if TYPE_CHECKING:
    from .suite import Suite


@dataclass(frozen=True)
class Profile:
    """The settings of a run; ``suites`` holds each suite's resolved settings (read them with :meth:`of`)."""

    name: str
    seed: int = 0
    device: str = "cpu"
    threads: int = 2
    dtype: str = "float32"  # of the tensors the suites measure (--dtype); correctness tests every dtype
    variant_timeout_seconds: float = 900.0  # a worker is stopped after this long on one job (--timeout overrides)
    processes: int = 3  # fresh worker processes that each measure a check giving a combine (timings: --processes)
    variant_options: dict = field(default_factory=dict)  # --option KEY=VALUE, for variants that have the option
    suites: Mapping[str, Mapping[str, object]] = field(default_factory=dict)

    def of(self, suite: str) -> SimpleNamespace:
        """``suite``'s settings in this run, as attributes."""
        if suite not in self.suites:
            raise OptionError(f"profile {self.name!r} holds no settings of the {suite!r} suite (known: "
                              f"{', '.join(self.suites) or 'none'}): resolve it with zoo.profiles.get_profile")
        return SimpleNamespace(**self.suites[suite])

    def as_dict(self) -> dict:
        """The profile as plain data (what a run records and a worker reads)."""
        data = dataclasses.asdict(self)
        data["suites"] = {name: dict(values) for name, values in self.suites.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict, suites: Mapping[str, "Suite"] | None = None) -> "Profile":
        """Inverse of :meth:`as_dict` after a JSON round trip (lists back to tuples). A run stored before settings
        were nested under their suites is read through each suite's :attr:`~zoo.Suite.legacy` names (``suites``:
        the registered ones by default)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"suites"}
        nested = data.get("suites")
        if nested is None:
            nested = legacy_settings(data, _registered() if suites is None else suites)
        named = PROFILES.get(data.get("name")) if isinstance(data.get("name"), str) else None
        data = {**({k: getattr(named, k) for k in known} if named else {}),  # a key stored later: its profile's
                "processes": 1, **data}  # a run stored before timings were repeated was measured in one process
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known},
                   suites={name: {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
                           for name, values in nested.items()})

    def with_overrides(self, **changes) -> "Profile":
        """The run-wide settings changed (None leaves one as it is)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def with_settings(self, suite: str, **changes) -> "Profile":
        """``suite``'s settings changed; a key it does not have is an error naming both."""
        unknown = sorted(set(changes) - set(self.suites.get(suite, {})))
        if unknown:
            raise OptionError(f"--set: the {suite} suite has no setting {', '.join(map(repr, unknown))} (its settings: "
                              f"{', '.join(self.suites.get(suite, {})) or 'none'})")
        return dataclasses.replace(self, suites={**self.suites, suite: {**self.suites[suite], **changes}})


PROFILES = {
    # two processes, n <= 512: a first board in a few minutes on two cores; the long board times to n = 16384
    "quick": Profile(name="quick", processes=2),
    "full": Profile(name="full", variant_timeout_seconds=4 * 3600.0),
    # seconds, not minutes: for tests and for trying a new plugin end to end (figures too coarse to publish)
    "smoke": Profile(name="smoke", threads=1, processes=1),
}


def _shaped(suite: str, key: str, value, default):
    """An override in the shape of the setting's default: one value where a tuple is expected is a tuple of one
    (``--set speed.modes=full``); null stays None; text where a number or a flag is expected is an
    :class:`OptionError`."""
    if value is None:
        return value
    if isinstance(default, tuple) and not isinstance(value, tuple):
        return (value,)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise OptionError(f"--set {suite}.{key}: expected true or false, got {value!r}")
    if isinstance(default, (int, float)) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, (int, float))):
        raise OptionError(f"--set {suite}.{key}: expected a number, got {value!r}")
    return value


def resolve(base: Profile, suites: Mapping[str, "Suite"], overrides: Mapping[str, Mapping[str, object]] | None = None,
            ) -> Profile:
    """``base`` with every suite's settings: defaults, then the suite's preset for the profile, then ``overrides``
    (suite -> key -> value); a suite or key that does not exist is an :class:`OptionError` naming it."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(suites))
    if unknown:
        raise OptionError(f"--set: no suite {', '.join(map(repr, unknown))} (suites: {', '.join(suites)})")
    resolved = {}
    for name, suite in suites.items():
        values = {**suite.settings, **suite.presets.get(base.name, {})}
        given = dict(overrides.get(name, {}))
        extra = sorted(set(given) - set(values))
        if extra:
            raise OptionError(f"--set: the {name} suite has no setting {', '.join(map(repr, extra))} (its settings: "
                              f"{', '.join(values) or 'none'})")
        values.update({key: _shaped(name, key, value, values[key]) for key, value in given.items()})
        if suite.settle is not None:
            try:
                values = dict(suite.settle(dict(values)))
            except ValueError as exc:
                raise OptionError(f"--set: the {name} suite's settings do not fit together: {exc}") from None
        resolved[name] = values
    return dataclasses.replace(base, suites=resolved)


def get_profile(name: str, suites: Mapping[str, "Suite"] | None = None) -> Profile:
    """The named profile with every suite's settings (``suites``: the registered ones by default)."""
    try:
        base = PROFILES[name]
    except (KeyError, TypeError):
        raise OptionError(f"--profile: unknown profile {name!r} (choose from {', '.join(PROFILES)})") from None
    return resolve(base, _registered() if suites is None else suites)


RUN_FLAGS = {"device": "--device", "threads": "--threads", "processes": "--processes", "dtype": "--dtype"}


def run_arguments(settings: dict, suites: Mapping[str, "Suite"], measured=None) -> list[str] | None:
    """The ``zoo run`` options that rebuild the recorded ``settings`` from their named profile (``--profile``, each
    run-wide flag and ``--set`` for what differs from it), so a new run lands on the same board; None where no
    option reaches a recorded setting (a run stored before settings were nested, or a seed set in Python).
    ``measured``: the suites the command runs (None: every suite); ``--set`` only for theirs, since a run refuses a
    setting of a suite it skips and takes that suite's settings from the board folder's runs of it."""
    if not isinstance(settings.get("suites"), dict) or settings.get("name") not in PROFILES:
        return None
    recorded, base = Profile.from_dict(settings, suites), get_profile(settings["name"], suites)
    if set(recorded.suites) != set(base.suites):
        return None
    arguments = ["--profile", recorded.name]
    for run_wide in dataclasses.fields(Profile):
        name, value = run_wide.name, getattr(recorded, run_wide.name)
        if name in ("name", "suites") or value == getattr(base, name):
            continue
        if name == "variant_options":
            arguments += [part for key, option in sorted(value.items()) for part in ("--option", f"{key}={json.dumps(option)}")]
        elif name in RUN_FLAGS:
            arguments += [RUN_FLAGS[name], str(value)]
        else:
            return None
    for suite, values in recorded.suites.items():
        if measured is not None and suite not in measured:  # a run refuses those: it takes them from the folder
            continue
        for key, value in values.items():
            if base.suites[suite].get(key) != value:
                value = list(value) if isinstance(value, tuple) else value
                arguments += ["--set", f"{suite}.{key}={json.dumps(value, separators=(',', ':'))}"]
    return arguments


def legacy_settings(data: dict, suites: Mapping[str, "Suite"]) -> dict[str, dict]:
    """The nested settings of a run stored flat (before settings were nested under their suites): each suite's
    defaults and its preset for the run's profile (what a run of that profile measures, such as a full run's causal
    timings at every length), with every flat key its :attr:`~zoo.Suite.legacy` names."""
    return {name: {**suite.settings, **suite.presets.get(data.get("name"), {}),
                   **{key: data[flat] for flat, key in suite.legacy.items() if flat in data}}
            for name, suite in suites.items()}


def settled(suite: "Suite", values: dict) -> dict:
    """``values`` as the suite settles them (as :func:`resolve` does for a new run); as they are where they do not
    fit together."""
    if suite.settle is None:
        return values
    try:
        return dict(suite.settle(dict(values)))
    except (ValueError, KeyError, TypeError):
        return values


def _registered():
    from .api import default_registry

    return default_registry().suites
