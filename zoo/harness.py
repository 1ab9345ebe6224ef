"""The harness's entry point: ``zoo.run(...)`` selects, validates, plans, executes and reports, in that
order, and returns the run's results as a DataFrame. ``zoo run``/``zoo run-all`` are a thin layer over
it; a notebook can call it directly::

    import zoo
    results = zoo.run(["windowed", "linear"], suites=["correctness", "speed"], profile="smoke", out="/tmp/board")
    results.attrs["run_id"], results.attrs["leaderboard"]

Every bad value is a :class:`zoo.ZooError` naming the option before any work starts (the CLI prints
it as one line and exits 2); a plugin's own faults become that variant's error rows.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import pandas as pd

from .checks import TIMING_FORM
from .contract import OptionError
from .environment import timing_form

MAX_LENGTH = 2 ** 20  # the plan counts real calls at the two smallest lengths: keep those allocatable
MIN_MEMORY_GIB = 1.0  # below this a worker cannot start torch (its BLAS fails to allocate at 0.5 GiB)


def run(variants: str | Iterable[str] | None = None, *, filters: str | Iterable[str] | None = None,
        suites: str | Iterable[str] | None = None, profile: str | None = None, out: str | os.PathLike = "leaderboard",
        device: str | None = None, dtype: str | None = None, threads: int | None = None, processes: int | None = None,
        d_model: int | None = None,
        heads: int | None = None, lengths: Iterable[int] | None = None, repeats: int | None = None,
        options: Mapping[str, object] | None = None, suite_settings: Mapping[str, Mapping[str, object]] | None = None,
        timeout: float | None = None,
        memory_limit_gib: float | None = None, executor: str = "local", address: str | None = None,
        resume: bool = False, retry_errors: bool = False, plugins_dirs: Iterable[str] = (), registry=None,
        strict: bool = False, warn: Callable[[str], None] = lambda message: None, command: str | None = None,
        progress: Callable[[str], None] = lambda line: None) -> pd.DataFrame:
    """Run suites on variants and write the leaderboard into ``out``; return the run's result rows
    (``attrs``: ``run_id``, ``store``, ``leaderboard``). ``variants`` names them (one name or several); else
    ``filters`` (wildcards) select among all registered ones; else all. ``suites`` default to the profile's
    (``profile``: quick unless given). Every value is checked before plugins load or anything is written
    (:func:`check_options`); ``warn`` is told of each plugin that failed to load (``strict``: that is an error).
    ``suite_settings`` (suite -> setting -> value, ``--set SUITE.KEY=VALUE``) change a suite's settings; the
    shorthands ``lengths``, ``d_model``, ``heads`` and ``repeats`` set the setting of that name in every suite
    that has one. ``resume`` continues this machine's latest unfinished run in ``out`` with its own settings.
    ``attrs["suites"]`` holds the suites that drew the board, ``attrs["summary"]`` what :func:`zoo.leaderboard.summary`
    says of the run on that board."""
    from .folder import BoardFolder
    from .profiles import Profile, resolve
    from .registry import load_registry
    from .runner import LANES, Launchers

    # validate: every value, before a plugin loads or anything is written
    variants, filters, suites = (_names(label, value) for label, value in
                                 (("variants", variants), ("--filter", filters), ("--suite", suites)))
    plugins_dirs = [plugins_dirs] if isinstance(plugins_dirs, (str, os.PathLike)) else list(plugins_dirs)
    if resume:
        _refuse_new_settings({"--profile": profile, "--device": device, "--dtype": dtype, "--threads": threads,
                              "--processes": processes,
                              "--d-model": d_model, "--heads": heads, "--lengths": lengths, "--repeats": repeats,
                              "--option": options, "--set": suite_settings})
    base, asked = check_options(
        profile or "quick", device=device or "cpu", dtype=dtype, threads=threads, processes=processes,
        d_model=d_model, heads=heads,
        lengths=lengths, repeats=repeats, options=options, suite_settings=suite_settings, executor=executor,
        timeout=timeout, memory_limit_gib=memory_limit_gib, address=address, resume=resume, retry_errors=retry_errors)
    _check_executor(executor, address)
    folder = BoardFolder(out)
    if resume and not folder.exists():
        raise OptionError(f"--resume: no run to continue in {str(folder.path)!r} (no {folder.database.name} there)")
    folder.path_must_be_writable()
    # a local run's first launcher imports torch while plugins load
    with Launchers() if executor == "local" else contextlib.nullcontext() as launchers:
        # select: the variants, the suites and their settings
        if registry is None:
            registry = load_registry(plugins_dirs, strict=strict)
            for failure in registry.failures:
                warn(failure.message())
        names = _select(registry, variants, filters)
        settings = resolve(base, registry.suites, asked.per_suite(registry.suites))
        chosen = _suites(registry, suites, settings)
        _refuse_settings_of_skipped_suites(asked.given, chosen)
        _check_variant_settings(registry, names, settings, chosen)
        # plan: the run (new, or the one resumed, with its own settings) and the jobs it still lacks
        store = folder.for_writing()  # the database, with the runs of the committed export it lacks
        for line in folder.notices(writing=True):
            progress(line)
        run_id = _run_to_resume(store, retry_errors, folder) if resume else None
        if run_id is not None:
            settings = Profile.from_dict(store.settings(run_id), registry.suites)  # a resumed run keeps its own
        else:
            settings = _board_settings_kept(store, settings, chosen, registry)
        run_options = _run_options(settings, folder, timeout, plugins_dirs, memory_limit_gib, address)
        _check_device_available(settings.device, executor, address)
        run_id = run_id or _start(store, settings, command)
        todo = _jobs_to_do(store, run_id, names, chosen, retry_errors, registry, settings.processes)
        if launchers is not None and any(job.side_by_side for job in todo):
            for lane in range(1, LANES):  # started now, while nothing is timed
                launchers.lane(lane)
        pending = len({(job.variant, job.suite) for job in todo})
        passes = f" ({len(todo)} counting each timing process)" if len(todo) != pending else ""
        progress(f"zoo: run {run_id}: {pending} jobs{passes} ({len(names) * len(chosen) - pending} already done), "
                 f"profile {settings.name}, {settings.threads} threads, timings from {settings.processes} process(es), "
                 f"results in {folder.database}\n")
        # execute, then report: the board and the export of every kept run, as a whole
        _execute(registry, store, run_id, todo, _executor(executor, run_options, launchers), settings, progress)
    return _report(store, run_id, folder, registry, warn)


def _board_settings_kept(store, settings, chosen: list[str], registry):
    """``settings`` with, for each suite this run does not measure, that suite's settings in the latest run of the
    folder with the same run-wide settings, on this kind of machine, that measured it. A board shows a suite's rows
    from the runs with its own run's settings of that suite, and those settings change nothing a run that skips the
    suite measures: so a run of one suite into a board folder (the long board's inference, run without its speed
    suite's ``--lengths``) keeps the board's other sections instead of emptying them."""
    import dataclasses
    import json

    from .environment import fingerprint, machine_kind
    from .profiles import Profile

    def run_wide(profile) -> str:
        return json.dumps({k: v for k, v in profile.as_dict().items() if k != "suites"}, sort_keys=True, default=str)

    wide, here, kept = run_wide(settings), machine_kind(fingerprint(settings, settings.device)), {}
    for run in reversed(list(store.runs().run_id)):
        try:
            earlier = Profile.from_dict(store.settings(run), registry.suites)
        except (TypeError, ValueError, KeyError):  # a run stored in a form this zoo cannot read
            continue
        if run_wide(earlier) != wide or machine_kind(store.environment(run)) != here:
            continue
        for suite in set(store.jobs(run).suite) - set(chosen) - set(kept):
            if suite in earlier.suites and suite in settings.suites:
                kept[suite] = dict(earlier.suites[suite])
    return dataclasses.replace(settings, suites={**settings.suites, **kept}) if kept else settings


def _refuse_settings_of_skipped_suites(given: Mapping[str, Mapping[str, object]], chosen: list[str]) -> None:
    """``--set`` of a suite this run does not measure would change nothing it measures, and in a board folder the
    run takes that suite's settings from the folder's runs of it (:func:`_board_settings_kept`): refused, so a
    setting is never silently dropped. (The shorthands apply to the run's suites that have the setting.)"""
    for suite, values in given.items():
        if suite not in chosen and values:
            raise OptionError(f"--set {suite}.{next(iter(values))}: the {suite} suite is not in this run (it runs "
                              f"{', '.join(chosen)}): name it among the run's --suite options, or drop the setting")


def _refuse_new_settings(given: dict) -> None:
    """A resumed run keeps the settings it started with: any option that would change them is refused."""
    named = ", ".join(label for label, value in given.items() if value is not None)
    if named:
        raise OptionError(f"--resume: continues a run with the settings it started with; {named} cannot change "
                          "them (drop them, or start a new run without --resume)")


def _check_executor(executor: str, address: str | None) -> None:
    """Ray installed and, for --address, a Ray cluster answering there (a child process asks it, briefly)."""
    if executor == "ray":
        from .ray_executor import check_reachable, require_ray

        require_ray()
        if address:
            check_reachable(address)


def _start(store, settings, command: str | None) -> str:
    """A new run in ``store``, with its settings and this machine's fingerprint; its id."""
    from .environment import fingerprint
    from .runner import now

    environment = {**fingerprint(settings, settings.device), "command": command or "zoo.run(...)"}
    return store.start_run(settings.as_dict(), environment, now())


def _jobs_to_do(store, run_id: str, names: list[str], suites: list[str], retry_errors: bool, registry,
                processes: int) -> list:
    """The (variant, suite) jobs the run has not finished (``retry_errors``: nor finished with errors), each in as
    many processes as its suite is measured in."""
    from .runner import plan_jobs, processes_per_suite

    finished = store.finished_jobs(run_id, without_errors=retry_errors)
    beside = [suite for suite in suites if registry.suite(suite).side_by_side]
    return [job for job in plan_jobs(names, suites, processes_per_suite(registry, suites, processes), beside)
            if (job.variant, job.suite) not in finished]


def _run_options(settings, folder, timeout, plugins_dirs, memory_limit_gib, address):
    """What every worker is told: the settings, its limits, where plugins and scratch space are."""
    from .runner import RunOptions, worker_memory_limit

    return RunOptions(
        profile=settings, timeout_seconds=timeout or settings.variant_timeout_seconds,
        plugins_dirs=[str(Path(p).resolve()) for p in plugins_dirs],
        memory_limit_bytes=worker_memory_limit(settings.device, memory_limit_gib), ray_address=address,
        scratch_dir=str(folder.scratch.resolve()))


def _executor(kind: str, options, launchers=None):
    """The executor of that kind: worker processes here (started by ``launchers``, :class:`zoo.runner.Launchers`),
    or Ray tasks."""
    if kind == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(options)
    from .runner import LocalExecutor

    return LocalExecutor(options, launchers)


def _execute(registry, store, run_id: str, todo: list, executor, settings, progress) -> None:
    """Every job through the executor; a run stopped before any job finished leaves no trace."""
    from .runner import execute, now

    try:
        execute(registry, store, run_id, todo, executor, settings, progress=progress)
    except BaseException:
        with contextlib.suppress(Exception):  # the reason the run stopped is what the user must see
            store.discard_if_empty(run_id)
        raise
    store.finish_run(run_id, now())


def _report(store, run_id: str, folder, registry, warn) -> pd.DataFrame:
    """The board and the export written (a run far noisier than the board: its own board beside it, and ``warn``
    says why); the run's rows, with where they went in ``attrs``."""
    from .leaderboard import HELD_BACK_FOLDER, board_of, board_run, render, summary

    shown, held = board_run(store, registry.suites)
    board = None if run_id in held else board_of(store, run_id, registry.suites, folder.path, held)
    written = render(store, shown if run_id in held else run_id, folder.path, keep_runs=True, suites=registry.suites,
                     held_runs=held, board=board)
    if run_id in held:
        beside = folder.path / HELD_BACK_FOLDER
        written = render(store, run_id, beside, suites=registry.suites, held_back=held[run_id], held_runs=held)
        warn(f"run {run_id} did not replace the board in {folder.path} (it still shows run {shown}): {held[run_id]}; "
             f"its own board is in {beside} and it is kept in the store (zoo leaderboard --run {run_id} --out "
             f"{folder.path} publishes it)")
    results = store.results(run_id)
    results.attrs.update(run_id=run_id, store=str(store.path), leaderboard=str(written[0]), folder=str(folder.path),
                         suites=registry.suites, held_runs=held,
                         summary=summary(store, run_id, registry.suites, folder.path, held, board))
    return results


def started_here(store, runs) -> list[str]:
    """Those of ``runs`` (ids, in order) that this machine started: the only ones ``--resume`` continues here."""
    import socket

    here = socket.gethostname()
    return [run for run in runs if store.environment(run).get("host") == here]


def _run_to_resume(store, retry_errors: bool, folder) -> str:
    """The latest run in ``store`` that this machine started and did not finish (with ``retry_errors``: finished
    or not): a run started elsewhere (a committed board's, another machine's) is never continued here, as
    its figures and this machine's would then share one run."""
    runs = store.runs()
    if not retry_errors:
        runs = runs[runs.finished.isna()]
    mine = started_here(store, runs.run_id)
    if not mine:
        elsewhere = f" ({len(runs)} started on other machines)" if len(runs) else ""
        raise OptionError(f"--resume: no {'' if retry_errors else 'unfinished '}run this machine started in "
                          f"{str(folder.database)!r}{elsewhere}")
    form = timing_form(store.environment(mine[-1]))
    if form != TIMING_FORM:  # its remaining jobs would time other figures than its first ones under its one form
        raise OptionError(f"--resume: run {mine[-1]} timed in form {form} and this zoo times in form {TIMING_FORM} "
                          "(zoo.checks.TIMING_FORM); start a new run without --resume")
    return mine[-1]


@dataclass(frozen=True)
class SuiteOverrides:
    """What a run asks of the suites' settings: ``shorthands`` (setting -> value, for every suite that has a
    setting of that name) and ``given`` (suite -> setting -> value)."""

    shorthands: dict
    given: dict

    def per_suite(self, suites) -> dict[str, dict]:
        """Suite -> the settings to change in it (a suite or setting that does not exist stays in, to be refused)."""
        wanted = {name: {k: v for k, v in self.shorthands.items() if v is not None and k in suite.settings}
                  for name, suite in suites.items()}
        for name, values in self.given.items():
            wanted.setdefault(name, {}).update(values)
        return {name: values for name, values in wanted.items() if values}


def check_options(profile: str = "quick", *, device: str = "cpu", dtype=None, threads=None, processes=None,
                  d_model=None, heads=None,
                  lengths=None, repeats=None, options=None, suite_settings=None, executor: str = "local", timeout=None,
                  memory_limit_gib=None, address=None, resume: bool = False, retry_errors: bool = False):
    """Every option of a run checked by name, the one validation for :func:`run` and the CLI (which passes its
    parsed values straight on), before any plugin loads: returns the profile with this run's own settings and
    what it asks of the suites' (:class:`SuiteOverrides`, resolved once the suites are known), or raises
    :class:`OptionError` naming the option and the value."""
    if not isinstance(profile, str):
        raise OptionError(f"--profile: expected a profile name, got {profile!r}")
    for label, value in (("--threads", threads), ("--processes", processes), ("--d-model", d_model), ("--heads", heads),
                         ("--repeats", repeats)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise OptionError(f"{label}: must be a positive integer, got {value!r}")
    for label, value, least in (("--timeout", timeout, 0.0), ("--memory-limit", memory_limit_gib, MIN_MEMORY_GIB)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise OptionError(f"{label}: must be a finite number, got {value!r}")
        if value <= least:
            raise OptionError(f"{label}: must be more than {least:g}, got {value!r}" +
                              (" (GiB: a worker needs about 1 GiB of address space to start torch)" if least else ""))
    if memory_limit_gib is not None and memory_limit_gib * 2 ** 30 >= 2 ** 62:
        raise OptionError(f"--memory-limit: {memory_limit_gib!r} GiB is more address space than a process can be "
                          "given (leave it out for 80% of this machine's memory)")
    if options is not None and (not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options)):
        raise OptionError(f"--option: expected a mapping of option names to values, got {options!r}")
    if suite_settings is not None and (not isinstance(suite_settings, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) and all(isinstance(key, str) for key in v)
            for k, v in suite_settings.items())):
        raise OptionError(f"--set: expected suite -> setting -> value, got {suite_settings!r}")
    if lengths is not None:
        if isinstance(lengths, (str, bytes, Mapping)) or not isinstance(lengths, Iterable):
            raise OptionError(f"--lengths: expected a list of integers, got {lengths!r}")
        lengths = list(lengths)
        if not lengths or any(isinstance(n, bool) or not isinstance(n, int) for n in lengths):
            raise OptionError(f"--lengths: expected a list of integers, got {lengths!r}")
        lengths = tuple(sorted(set(lengths)))
        if lengths[0] <= 0:
            raise OptionError(f"--lengths: lengths must be positive, got {lengths!r}")
        if lengths[-1] > MAX_LENGTH:
            raise OptionError(f"--lengths: {lengths[-1]} is longer than the zoo measures (at most {MAX_LENGTH})")
    if device not in ("cpu", "cuda"):
        raise OptionError(f"--device: expected cpu or cuda, got {device!r}")
    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise OptionError(f"--dtype: expected float32, bfloat16 or float16, got {dtype!r}")
    if executor not in ("local", "ray"):
        raise OptionError(f"--executor: expected local or ray, got {executor!r}")
    if executor == "local" and threads and threads > (os.cpu_count() or 1):
        raise OptionError(f"--threads: {threads} is more than this machine's {os.cpu_count()} CPUs")
    if address is not None and (executor != "ray" or not isinstance(address, str)):
        raise OptionError("--address: only used with --executor ray" if executor != "ray" else
                          f"--address: expected HOST:PORT or auto, got {address!r}")
    if retry_errors and not resume:
        raise OptionError("--retry-errors: only with --resume")
    from .profiles import PROFILES

    if profile not in PROFILES:
        raise OptionError(f"--profile: unknown profile {profile!r} (choose from {', '.join(PROFILES)})")
    base = PROFILES[profile].with_overrides(threads=threads, processes=processes, device=device, dtype=dtype,
                                            variant_options=dict(options) if options else None)
    shorthands = {"lengths": lengths, "d_model": d_model, "heads": heads, "repeats": repeats}
    return base, SuiteOverrides(shorthands, {k: dict(v) for k, v in (suite_settings or {}).items()})


def _names(label: str, value) -> list[str] | None:
    """Names given as one string or several: a string is one name, never its letters."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, Iterable) else None
    if not items or isinstance(value, Mapping) or not all(isinstance(item, str) and item for item in items):
        raise OptionError(f"{label}: expected a name or a list of names, got {value!r}")
    return items


def _select(registry, variants, filters) -> list[str]:
    if variants:
        return [registry.variant(name).name for name in variants]
    filters = list(filters or [])
    names = registry.list_variants(filters) if filters else registry.list_variants()
    if not names:
        raise OptionError(f"--filter: {', '.join(filters)} matches no variant (known: {', '.join(registry.list_variants())})")
    return names


def _suites(registry, suites, profile) -> list[str]:
    """The suites asked for, else those that run in the profile (each suite says in which)."""
    known = registry.suite_names()
    chosen = list(suites or [name for name in known if registry.suite(name).runs_in(profile.name)])
    unknown = [s for s in chosen if s not in known]
    if unknown:
        raise OptionError(f"--suite: unknown suite {', '.join(map(repr, unknown))} (known: {', '.join(known)})")
    return chosen


def _check_variant_settings(registry, names: list[str], profile, suites: list[str]) -> None:
    """Build every selected variant with the run's options at each shape the chosen suites measure now, so a bad
    value is one clear line before any work starts rather than an error row per variant later."""
    from .api import build
    from .profiles import get_profile

    for key in profile.variant_options:
        if not any(key in registry.variant(n).options for n in names):
            known = sorted({o for n in names for o in registry.variant(n).options})
            raise OptionError(f"--option: no selected variant has an option {key!r} (their options: {', '.join(known) or 'none'})")
    shapes = {}
    for suite in suites:
        values = profile.suites.get(suite, {})
        if "d_model" in values and "heads" in values:
            if values["d_model"] % values["heads"]:
                raise OptionError(f"--d-model/--heads: the {suite} suite's d_model {values['d_model']} is not "
                                  f"divisible by its heads {values['heads']}")
            shapes.setdefault((values["d_model"], values["heads"]), suite)
    quick = get_profile("quick", registry.suites).suites
    shapes = {shape: (quick[suite]["d_model"], quick[suite]["heads"]) for shape, suite in shapes.items()}
    if not shapes:  # no chosen suite names a shape (correctness alone): an option's value is still checked
        shapes[SMALL_SHAPE] = SMALL_SHAPE
    for (d_model, heads), usual in shapes.items():
        for name in names:
            variant = registry.variant(name).with_defaults(profile.variant_options)
            try:
                build(variant, d_model=d_model, num_heads=heads)
            except OptionError as exc:
                if _builds_with_defaults(registry.variant(name), *usual):
                    raise OptionError(f"--option/--d-model/--heads: {exc}") from None
            except Exception:  # a plugin's own bug, not a bad value: its worker records it as an error row
                continue


SMALL_SHAPE = (64, 2)
"""(d_model, heads) the options are checked at when no chosen suite names a shape."""


def _builds_with_defaults(variant, d_model: int, heads: int) -> bool:
    """Whether the variant builds with its own option defaults at the shape the quick profile would use: if so, a
    failure with the user's values is the user's (exit 2); if not, it is the plugin's (error rows)."""
    from .api import build

    try:
        build(variant, d_model=d_model, num_heads=heads)
    except Exception:
        return False
    return True


def _check_device_available(device: str, executor: str, address: str | None) -> None:
    """A cuda run needs a GPU here, unless its jobs go to a Ray cluster (which is asked when it starts)."""
    if device != "cuda" or (executor == "ray" and address):
        return
    import torch

    if not torch.cuda.is_available():
        raise OptionError("--device cuda: no CUDA device is available on this machine")
