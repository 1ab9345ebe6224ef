"""The `zoo` command: a thin layer over the API, registry, runner and leaderboard.

Imports of torch and plugin discovery happen inside the commands that need them, so `zoo --help`
stays instant.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path

from .contract import OptionError, ZooError
from .decoding import GROWTHS, why_not
from .export import DATABASE, EXPORT

DEFAULT_OUT = "leaderboard"


def _registry(args):
    from .registry import load_registry

    registry = load_registry(args.plugins_dir, strict=args.strict)
    for failure in registry.failures:
        print(f"zoo: warning: {failure.message()}", file=sys.stderr)
    return registry


def cmd_list(args) -> int:
    """zoo list: one line per variant."""
    registry = _registry(args)
    names = registry.list_variants(args.pattern)
    if args.pattern and not names:
        raise OptionError(f"pattern {args.pattern!r} matches no variant (known: {', '.join(registry.list_variants())})")
    width = max((len(n) for n in names), default=4)
    accuracy = {name: _accuracy(registry.variant(name)) for name in names}
    column = max((len(text) for text in accuracy.values()), default=5)
    for name in names:
        v = registry.variant(name)
        print(f"{name:<{width}}  {v.family:<9}  {accuracy[name]:<{column}}  {v.origin.label()}")
    return 0


def _decoding_text(variant) -> str:
    """How ``zoo show`` says a variant decodes: its state's growth, its fixed context, or why it does not."""
    if variant.decoder is None:
        return f"no: {why_not(variant)}"
    others = ", ".join(variant.decoder.baselines)
    others = f"; timed against its other decodes: {others}" if others else ""
    if variant.decoder.context:
        return "yes, over its context's keys and values (cached once, fixed while it decodes)" + others
    return f"yes, {variant.decoder.growth} state ({GROWTHS[variant.decoder.growth]})" + others


def _accuracy(variant) -> str:
    return f"approximates {variant.approximates}" if variant.approximates else "exact"


def cmd_show(args) -> int:
    """zoo show NAME: a variant's card."""
    registry = _registry(args)
    v = registry.variant(args.name)
    print(f"{v.name}: {v.summary}")
    print(f"  family:     {v.family}")
    print(f"  citation:   {v.citation}")
    print(f"  complexity: time O(n^{v.complexity.time:g}), memory O(n^{v.complexity.memory:g}) (claimed)")
    print(f"  accuracy:   {_accuracy(v)}" + ("" if v.approximates else " (for its own function)"))
    print("  capabilities:")
    for tag, value in v.tags.describe().items():
        print(f"    {tag:<26} {'yes' if value else 'no'}")
    print(f"  decoding:   {_decoding_text(v)}")
    print("  departures from the paper:" + ("" if v.departures else " none stated (it follows the paper as written)"))
    for departure in v.departures:
        print(f"    {departure.kind + ':':<14}{departure.text}")
    print("  options:" + ("" if v.options else " none"))
    for key, default in v.options.items():
        print(f"    {key} = {default!r}")
    if v.baselines:
        print(f"  baselines:  {', '.join(v.baselines)}")
    if v.best_known:
        print(f"  best known: {v.best_known} (the fastest implementation of its math known; the board shows the ratio)")
    if v.floors:
        print(f"  floors:     {', '.join(v.floors)} (timed as lower bounds, forward only)")
    for option, values in v.error_sweeps.items():
        print(f"  error sweep: {option} = {', '.join(map(repr, values))} (approximation error at each)")
    if v.peers:
        print(f"  peers:      {', '.join(v.peers)} (other libraries' implementations, timed beside it, forward only)")
    for target in v.targets:
        versus = f" vs {target.versus}" if target.versus else ""
        print(f"  target:     {target.note or target.check} ({target.check}{versus} {target.bound()})")
    print(f"  origin:     {v.origin.label()}")
    return 0


def cmd_plugins(args) -> int:
    """zoo plugins: what loaded from where, and what failed."""
    registry = _registry(args)
    for name, record in registry.plugins.items():
        o = record.origin
        source = f"{o.distribution} {o.version}" if o.distribution else o.location
        provides = ", ".join([f"suite {name}" for name in record.suites] + record.variants + record.checks) or "nothing"
        print(f"{name:<16} {o.kind:<10} {source}\n{'':<16} provides: {provides}")
    for failure in registry.failures:
        print(f"FAILED {failure.plugin} ({failure.origin}): {failure.error}")
    return 0


def cmd_suites(args) -> int:
    """Every suite: what it is for, where it runs, what blocks ranking, and its settings in ``--profile``."""
    from .profiles import get_profile

    registry = _registry(args)
    profile = get_profile(args.profile, registry.suites)
    for name in registry.suite_names():
        suite = registry.suite(name)
        where = "every profile" if suite.profiles is None else ", ".join(suite.profiles)
        flags = [f"blocks ranking on: {', '.join(suite.blocking)}", *(["ranking needs it"] if suite.required else []),
                 *(["ranks the variants"] if suite.ranking else [])]
        print(f"{name}: {suite.summary}\n  runs in:  {where} (unless --suite chooses)\n  {'; '.join(flags)}")
        print(f"  origin:   {suite.origin.label() if suite.origin else 'checks only (no zoo.Suite)'}")
        for key, value in profile.suites.get(name, {}).items():
            print(f"    {name}.{key} = {value!r}")
    return 0


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not math.isfinite(value):  # nan would silently disable a limit, inf overflow it
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    """Rejections in one line naming the option (the usage block only with --help)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def cmd_run(args) -> int:
    """zoo run / run-all: the harness (zoo.run), then the summary."""
    from .harness import run

    results = run(getattr(args, "names", None), filters=args.filter, suites=args.suite, profile=args.profile, out=args.out,
        device=args.device, dtype=args.dtype, threads=args.threads, processes=args.processes, d_model=args.d_model,
        heads=args.heads,
        lengths=_parse_lengths(args.lengths), repeats=args.repeats, options=_parse_options(args.option),
        suite_settings=_parse_settings(args.set),
        timeout=args.timeout, memory_limit_gib=args.memory_limit, executor=args.executor, address=args.address,
        resume=args.resume, retry_errors=args.retry_errors, plugins_dirs=args.plugins_dir, strict=args.strict,
        warn=lambda message: print(f"zoo: warning: {message}", file=sys.stderr),
        command=" ".join(["zoo", *sys.argv[1:]]), progress=_progress_printer(sys.stderr))
    _summary(results)
    print(f"zoo: leaderboard written to {results.attrs['leaderboard']}", file=sys.stderr)
    return 0


def _parse_options(pairs: list[str] | None) -> dict | None:
    """--option KEY=VALUE: VALUE read as JSON (numbers, true/false, null), else kept as text."""
    if not pairs:
        return None
    options = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise OptionError(f"--option: expected KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(text)
        except json.JSONDecodeError:
            options[key] = text
    return options


def _parse_settings(pairs: list[str] | None) -> dict | None:
    """--set SUITE.KEY=VALUE: VALUE read as JSON (lists as tuples), else kept as text; suite -> key -> value."""
    if not pairs:
        return None
    settings: dict[str, dict] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        suite, dot, key = name.partition(".")
        if not sep or not dot or not suite or not key:
            raise OptionError(f"--set: expected SUITE.KEY=VALUE, got {pair!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        settings.setdefault(suite, {})[key] = tuple(value) if isinstance(value, list) else value
    return settings


def _parse_lengths(text: str | None) -> tuple[int, ...] | None:
    """--lengths 1024,4096: the sequence lengths measured, instead of the profile's."""
    if not text:
        return None
    try:
        lengths = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise OptionError(f"--lengths: expected comma-separated integers, got {text!r}") from None
    if not lengths:
        raise OptionError(f"--lengths: expected comma-separated integers, got {text!r}")
    return lengths


def _progress_printer(stream):
    """Redraw one line per job on a terminal; elsewhere (CI logs) print only finished jobs."""
    interactive = stream.isatty()

    def show(text: str) -> None:
        if not interactive:
            if not text.endswith("\n"):
                return
            text = text.lstrip("\r")
        stream.write(text)
        stream.flush()

    return show


def _summary(results) -> None:
    """One screen: per variant, its kind, the ranking gate and its ranking figure."""
    from tabulate import tabulate

    rows, stale = results.attrs["summary"]
    print("\n" + tabulate(rows, headers="keys", tablefmt="plain"))
    for line in stale:
        print(f"zoo: {line}")


def cmd_leaderboard(args) -> int:
    """zoo leaderboard: re-render a board from its runs, writing no store. Where a run, merge or prune publishes
    the folder's runs anew while the board is drawn, it is drawn again from them, up to :data:`DRAWS` times (an
    older board never replaces the newer one)."""
    suites = _registry(args).suites
    if args.by == "device":
        return _leaderboard_by_device(_read_only_store(args.out)[1], Path(args.out), suites)
    if not _draw(args.out, suites, args.run):
        raise OptionError(f"--out: no run in {str(Path(args.out))!r}")
    return 0


def _draw(out, suites, run: str | None = None, say: bool = True) -> bool:
    """Draw the board of ``out`` from its runs: of ``run``, or of the run its board shows; False where it holds
    no run to draw."""
    from .folder import RunsChanged, resolve_run
    from .leaderboard import board_run, render

    for attempt in range(1, DRAWS + 1):
        folder, store = _read_only_store(out, say=say and attempt == 1)
        shown, held = board_run(store, suites)
        if run:
            run_id = resolve_run(store, run, folder.database, "--run: ")
        else:
            run_id = shown
            if run_id is None:
                return False
            for other, why in held.items() if attempt == 1 else ():
                print(f"zoo: run {other} is held back ({why}): zoo leaderboard --run {other} publishes it",
                      file=sys.stderr)
        try:
            written = render(store, run_id, Path(out), suites=suites, held_runs=held, read_from=folder)
        except RunsChanged as changed:
            if attempt == DRAWS:
                raise RunsChanged(f"{changed} ({DRAWS} times): run it again once the runs publishing there are done") \
                    from None
            print(f"zoo: {changed}: drawing it again", file=sys.stderr)
            continue
        print(f"zoo: leaderboard for run {run_id} written to {written[0]}", file=sys.stderr)
        return True


DRAWS = 3
"""How many times `zoo leaderboard` draws a board whose runs were published anew meanwhile before it gives up."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attention-zoo")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def _read_only_store(out: str, say: bool = True):
    """``--out``'s folder and its runs for a command that only reads them: the join of its database and its
    committed export, in memory (neither file is written); ``say``: print what the join found to say."""
    from .folder import BoardFolder

    folder = BoardFolder(out)
    store = folder.for_reading()
    for line in folder.notices(writing=False) if say else ():
        print(line, file=sys.stderr)
    return folder, store


def _leaderboard_by_device(store, out: Path, suites) -> int:
    from .leaderboard import render_by_device

    index, kinds = render_by_device(store, out / "by-device", suites)
    print(f"zoo: {kinds} device leaderboards and their comparison written under {index.parent}", file=sys.stderr)
    return 0


def cmd_merge(args) -> int:
    """zoo merge: other machines' runs into --out's."""
    from .folder import BoardFolder

    suites = _registry(args).suites  # before anything is added: a plugin that fails to load changes nothing
    folder = BoardFolder(args.out)
    merged = 0
    for source in args.databases:
        added, present = folder.merge(source)
        merged += len(added)
        for line in folder.notices(writing=True):
            print(line, file=sys.stderr)
        print(f"zoo: merged {len(added)} run(s) from {source}" + (f" ({present} already here)" if present else ""),
              file=sys.stderr)
    if merged and (folder.path / "README.md").is_file():
        _draw_again(folder, suites)  # a run merged may be the one its board must now show
    return 0


def cmd_prune(args) -> int:
    """zoo prune: the one command that removes runs."""
    from .folder import BoardFolder, resolve_run

    if bool(args.runs) == args.unshown:
        raise OptionError("prune: name the runs to remove (RUN ...), or give --unshown for every run no board shows")
    suites = _registry(args).suites  # before anything is removed: a plugin that fails to load changes nothing
    folder = BoardFolder(args.out)
    on_board = _runs_on_board(folder)
    kept: list[str] = []

    def chosen(store) -> set[str]:
        if args.unshown:
            from .harness import started_here
            from .leaderboard import shown_runs

            runs = store.runs()
            unshown = set(runs.run_id) - shown_runs(store, suites)
            # the latest unfinished run this machine started is in progress or what --resume continues: named only
            kept.extend(run for run in started_here(store, runs.run_id[runs.finished.isna()])[-1:] if run in unshown)
            return unshown - set(kept)
        return {resolve_run(store, given, folder.database) for given in args.runs}

    removed = folder.prune(chosen, dry_run=args.dry_run)
    for line in folder.notices(writing=not args.dry_run):
        print(line, file=sys.stderr)
    verb = "would remove" if args.dry_run else "removed"
    for run in removed:
        print(f"zoo: {verb} run {run.run_id} (started {run.run['started']}, {run.describe()})", file=sys.stderr)
    print(f"zoo: {verb} {len(removed)} run(s) from {folder.database.name} and {folder.export.name}", file=sys.stderr)
    for run in kept:
        print(f"zoo: kept run {run}: unfinished and started on this machine, so in progress or what --resume "
              "continues; name it to remove it", file=sys.stderr)
    if not args.dry_run and on_board & {run.run_id for run in removed}:
        _draw_again(folder, suites)  # the board showed a run removed, or took figures from one
    return 0


def _runs_on_board(folder) -> set[str]:
    """The runs whose rows the folder's board holds (its results.csv's run_id column; none without a board)."""
    import pandas as pd

    table = folder.path / "results.csv"
    return set(pd.read_csv(table, usecols=["run_id"]).run_id) if table.is_file() else set()


def _draw_again(folder, suites) -> None:
    """The board of a folder whose runs a merge or prune just changed, drawn as `zoo leaderboard` draws it; where it
    cannot be, one line says so and how to draw it (the runs changed all the same)."""
    from .folder import RunsChanged

    again = f"zoo leaderboard --out {str(folder.path)!r} draws it"
    try:
        if not _draw(folder.path, suites, say=False):
            print(f"zoo: no run is left in {str(folder.path)!r}: its board still shows the runs removed",
                  file=sys.stderr)
    except RunsChanged as changed:
        print(f"zoo: warning: the board was not drawn again ({changed}): {again}", file=sys.stderr)


def cmd_new(args) -> int:
    """zoo new: a plugin distribution to start from."""
    from .scaffold import scaffold

    root = scaffold(args.names, args.dir)
    print(f"zoo: wrote {root}/ ({', '.join(args.names)}) - next: pip install -e '{root}[test]' && python -m pytest "
          f"{root} && zoo check {args.names[0]}")
    return 0


def cmd_check(args) -> int:
    """Correctness suite on one plugin: an installed variant's name, a module path, or a .py file."""
    from .checks import BAD, ERROR, FAILED, PASSED, SKIPPED
    from .registry import load_registry
    from .testing import check_variant, variants_of

    registry, names = variants_of(args.target, installed=lambda: load_registry(args.plugins_dir, strict=args.strict),
                                  warn=lambda failure: print(f"zoo: warning: {failure.message()}", file=sys.stderr))
    failed = 0
    for name in names:
        variant = registry.variant(name)
        print(f"{name} ({variant.origin.label()}), profile {args.profile}:")
        for outcome in check_variant(variant, args.profile, registry):
            mark = {PASSED: "ok  ", SKIPPED: "skip", FAILED: "FAIL", ERROR: "ERR "}[outcome.status]
            print(f"  {mark} {outcome.describe()}")
            failed += outcome.status in BAD
    print(f"\n{failed} check(s) failed" if failed else "\nall applicable checks passed")
    return 1 if failed else 0


def cmd_compare(args) -> int:
    """zoo compare: what changed between two runs."""
    from tabulate import tabulate

    from .compare import compare_runs

    comparison = compare_runs(args.out, args.run_a, args.run_b, _registry(args).suites)
    for line in comparison.notices:
        print(line, file=sys.stderr)
    print(f"comparing {comparison.before} (before) with {comparison.after} (after)\n")
    for warning in comparison.warnings:
        print(f"zoo: warning: {warning}", file=sys.stderr)
    for title, frame in comparison.tables:
        print(f"## {title}\n")
        print(tabulate(frame, headers="keys", tablefmt="github", showindex=False, floatfmt=".3g") if not frame.empty else "(none)")
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    common = _Parser(add_help=False)
    common.add_argument("--plugins-dir", action="append", default=[], metavar="DIR",
                        help="load every .py file in DIR as a plugin (repeatable; also $ZOO_PLUGINS_DIR)")
    common.add_argument("--strict", action="store_true", help="a plugin that fails to load is an error (exit 2)")

    parser = _Parser(prog="zoo", description="A plugin-based zoo of attention mechanisms for PyTorch.")
    parser.add_argument("--version", action="version", version=f"zoo {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("list", parents=[common], help="list variants (wildcard filter)")
    p.add_argument("pattern", nargs="?", help="wildcard pattern, e.g. '*head*'")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", parents=[common], help="describe one variant")
    p.add_argument("name")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("suites", parents=[common], help="every suite, and its settings in a profile (--set SUITE.KEY)")
    p.add_argument("--profile", default="quick", help="the profile whose settings are shown (default quick)")
    p.set_defaults(func=cmd_suites)

    p = sub.add_parser("plugins", parents=[common], help="what loaded, from where, and what failed")
    p.set_defaults(func=cmd_plugins)

    run_options = _Parser(add_help=False)
    run_options.add_argument("--profile", help="quick (default; the README says how long it takes), full or smoke (seconds: that "
                             "everything runs, not figures for a board)")
    run_options.add_argument("--suite", action="append", help="run only this suite (repeatable)")
    run_options.add_argument("--device", help="cpu (default) or cuda")
    run_options.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default ./{DEFAULT_OUT})")
    run_options.add_argument("--resume", action="store_true",
                             help="finish this machine's last interrupted run in --out, with its own settings")
    run_options.add_argument("--retry-errors", action="store_true",
                             help="with --resume: redo the latest run's jobs that ended in an error (e.g. a killed worker)")
    run_options.add_argument("--executor", choices=("local", "ray"), default="local",
                             help="local worker processes (default) or a Ray cluster (pip install 'attention-zoo[ray]')")
    run_options.add_argument("--address", help="with --executor ray: the cluster's HOST:PORT, or auto for one "
                                                "running here (default: start a local one)")
    run_options.add_argument("--threads", type=_positive(int), help="torch threads (default: the profile's, 2)")
    run_options.add_argument("--processes", type=_positive(int),
                             help="fresh worker processes each timing is measured in (each a separate pass over the "
                                  "run's variants), for its spread between processes (default: the profile's, 3; "
                                  "smoke 1)")
    run_options.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                             help="dtype of the tensors the suites measure (default float32)")
    run_options.add_argument("--d-model", type=_positive(int), help="the d_model setting of every suite that has one")
    run_options.add_argument("--heads", type=_positive(int), help="the heads setting of every suite that has one")
    run_options.add_argument("--lengths", metavar="N,N,...",
                             help="the lengths setting (the sequence lengths measured) of every suite that has one")
    run_options.add_argument("--repeats", type=_positive(int), help="the repeats setting of every suite that has one")
    run_options.add_argument("--set", action="append", metavar="SUITE.KEY=VALUE",
                             help="one setting of one suite (repeatable; zoo suites lists every suite's settings "
                                  "and their values in a profile)")
    run_options.add_argument("--option", action="append", metavar="KEY=VALUE",
                             help="a variant option for this run, e.g. window=64 (repeatable)")
    run_options.add_argument("--timeout", type=_positive(float),
                             help="seconds one job (a variant's suite) may take before its worker is stopped (default: the profile's; quick 900)")
    run_options.add_argument("--memory-limit", type=_positive(float), metavar="GIB",
                             help="address-space cap per worker in GiB (default: 80%% of physical memory; "
                                  "none in a cuda run: CUDA reserves more address space than that)")

    p = sub.add_parser("run-all", parents=[common, run_options], help="run every suite on every variant; write the leaderboard")
    p.add_argument("--filter", action="append", metavar="PATTERN", help="only variants matching this wildcard (repeatable)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("run", parents=[common, run_options], help="like run-all, for the named variants")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(func=cmd_run, filter=None)

    p = sub.add_parser("new", help="scaffold a plugin distribution for a new variant")
    p.add_argument("names", nargs="+", metavar="NAME", help="the variants' names, e.g. my-attention (several: one "
                   "distribution, named after the first, with a module each)")
    p.add_argument("--dir", help="where to write it (default ./zoo-NAME)")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("check", parents=[common], help="run the correctness suite on one plugin and report")
    p.add_argument("target", help="an installed variant's name, a module path, or a .py file")
    p.add_argument("--profile", default="quick", help="quick (default) or full (more random cases)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("compare", parents=[common], help="what changed between two runs in the results database")
    p.add_argument("run_a", metavar="RUN_A", help="run id (or a unique prefix): before")
    p.add_argument("run_b", metavar="RUN_B", help="run id (or a unique prefix): after")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder holding {DATABASE}")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("leaderboard", parents=[common], help="re-render the leaderboard from the results database")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder holding {DATABASE}")
    p.add_argument("--run", help="run id or a unique prefix (default: the latest)")
    p.add_argument("--by", choices=("device",), help="one leaderboard per device kind, under OUT/by-device/")
    p.set_defaults(func=cmd_leaderboard)

    p = sub.add_parser("merge", parents=[common], help="add the runs of other machines' results databases or exports to --out's")
    p.add_argument("databases", nargs="+", metavar="DATABASE",
                   help=f"a {DATABASE} or a {EXPORT} from another machine")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"board folder to merge into (its {DATABASE} and {EXPORT})")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("prune", parents=[common], help="remove runs from --out's database and export (the one command that does)")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run id (or a unique prefix) to remove")
    p.add_argument("--unshown", action="store_true",
                   help="remove every run no board shows (each group of comparable runs keeps its latest's board; "
                        "the latest unfinished run this machine started, in progress or resumable, only when named)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"board folder (its {DATABASE} and {EXPORT})")
    p.add_argument("--dry-run", action="store_true", help="list the runs it would remove, and remove none")
    p.set_defaults(func=cmd_prune)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; bad input is one line and exit 2, a signal a line and 128 + its number."""
    args = build_parser().parse_args(argv)
    previous = _terminate_like_ctrl_c()
    try:
        status = args.func(args)
        if sys.stdout is not None:
            sys.stdout.flush()  # a closed pipe fails here, inside the handlers below, not at interpreter exit
        return status
    except ZooError as exc:
        print(f"zoo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        kept = "; finished jobs are kept (zoo run-all --resume continues)" if args.func is cmd_run else ""
        print(f"\nzoo: interrupted ({signal.Signals(signum).name}){kept}", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # stdout closed early (zoo show NAME | head): end quietly
        _drop_stdout()
        return 128 + signal.SIGPIPE
    except OSError as exc:  # the machine's, not the zoo's: a full disk, a missing folder, a file where one is needed
        where = f": {exc.filename}" if exc.filename else " (writing the output)"
        print(f"zoo: error: {exc.strerror or exc}{where}", file=sys.stderr)
        _drop_stdout()
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _drop_stdout() -> None:
    """Whatever stdout still holds goes nowhere, so the interpreter's exit does not fail on it again."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _terminate_like_ctrl_c():
    """SIGTERM stops a command as Ctrl-C does (one line, finished jobs kept, --resume works); returns the
    handler it replaced (None off the main thread, where handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signum)

    return signal.signal(signal.SIGTERM, interrupt)