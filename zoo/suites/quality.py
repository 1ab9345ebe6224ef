"""Quality suite: what a variant can learn. Every variant is trained with the same budget and
hyper-parameters on synthetic tasks, over a few seeds; accuracy on fresh examples is reported.

Not part of the quick profile's default suites (it takes minutes); run it with ``--suite quality``
or the full profile.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

import zoo
from zoo import plots as plots_
from zoo.board import fmt_g
from zoo.cases import relative_error
from zoo.blocks import SequenceModel, VisionTransformer
from zoo.checks import MEASURED, SKIPPED, Check, Result
from zoo.measure import count_flops
from zoo.tasks import IGNORE, Task, default_tasks
from zoo.workload import SDPA

SUITE = "quality"
EVAL_EXAMPLES = 512
EVAL_SEED = 10_000
IMAGE_SIZE, PATCH_SIZE = 16, 4  # the image task's vision model: 16 patches and a class token
DENSE_TOLERANCE = 1e-10  # float64: a core this close to dense softmax attention computes it


def hyper_parameters(profile, task: Task | None = None) -> dict:
    """The same for every variant; the recall sweep trains longer (its hardest setting needs it)."""
    settings = profile.of(SUITE)
    steps = settings.recall_steps if task is not None and task.pairs else settings.steps
    return {"d_model": 64, "heads": 4, "layers": 1, "batch": 32, "steps": steps,
            "optimizer": "AdamW", "lr": 3e-3, "weight_decay": 0.01}


def make_model(variant, task: Task, hp: dict, options: dict | None = None) -> torch.nn.Module:
    """The model a task trains: a sequence model or a small vision transformer around the variant (causal for a
    variant that computes only its causal form: every task's answers come after what they need), with the
    variant's quality options (``options``: others in their place)."""
    size = dict(d_model=hp["d_model"], num_heads=hp["heads"], layers=hp["layers"], causal=variant.tags.causal_only,
                **(variant.quality_options if options is None else options))
    if task.kind == "image":
        return VisionTransformer(variant, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, channels=1,
                                 classes=task.classes, **size)
    return SequenceModel(variant, vocab=task.vocab, classes=task.classes, max_len=task.length, **size)


def _loss(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


@torch.no_grad()
def accuracy(model, task: Task, device: str = "cpu") -> float:
    """The model's accuracy on fresh examples of the task."""
    model.eval()
    inputs, targets = (t.to(device) for t in task.make(torch.Generator().manual_seed(EVAL_SEED), EVAL_EXAMPLES))
    predictions = model(inputs).argmax(dim=-1)
    asked = targets != IGNORE
    model.train()
    return float((predictions[asked] == targets[asked]).float().mean())


@dataclass(frozen=True)
class Training:
    """What one training run gave: accuracy on fresh examples and seconds, or why it was not trained."""

    accuracy: float | None
    seconds: float
    skipped: str | None = None


def train(variant, task: Task, hp: dict, seed: int, max_gflop: float | None = None,
          device: str = "cpu", options: dict | None = None) -> Training:
    """Train for ``hp['steps']`` steps on ``device`` and score. With ``max_gflop``, a run whose counted
    FLOPs (one training step, counted, times the steps) exceed it is skipped before it starts: a guard
    that reads no clock, so a busy machine never changes which tasks are trained. Data comes from a CPU
    generator, so every device trains on the same examples."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = make_model(variant, task, hp, options).to(device)
    if max_gflop is not None:
        inputs, targets = (t.to(device) for t in task.make(torch.Generator().manual_seed(seed), hp["batch"]))
        predicted = count_flops(lambda: _loss(model, inputs, targets).backward()) * hp["steps"] / 1e9
        model.zero_grad(set_to_none=True)
        if predicted > max_gflop:
            return Training(None, 0.0, f"predicted {predicted:.3g} GFLOP to train (one step counted, times "
                                       f"{hp['steps']} steps), over the profile's cap of {max_gflop:g} GFLOP per task")
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    started = time.perf_counter()
    for step in range(hp["steps"]):
        inputs, targets = (t.to(device) for t in task.make(generator, hp["batch"]))
        optimizer.zero_grad(set_to_none=True)
        loss = _loss(model, inputs, targets)
        loss.backward()
        optimizer.step()
    if not math.isfinite(loss.item()):  # once NaN, the weights stay NaN: the last step tells
        raise FloatingPointError(f"training loss is {loss.item()} after {hp['steps']} steps on {task.name}")
    score = accuracy(model, task, device)  # its float() waits for the GPU
    return Training(score, time.perf_counter() - started)


def task_tokens(task: Task) -> int:
    """The length of the sequence the task's model attends over: its tokens, or the image's patches and class token."""
    return task.length or (IMAGE_SIZE // PATCH_SIZE) ** 2 + 1


def dense_difference(variant, n: int, hp: dict, seed: int) -> float:
    """How far the variant's core, with the options it trains with, is from dense softmax attention at length n
    (relative, float64, in its primary mode, at the tasks' model width)."""
    torch.manual_seed(seed)
    module = zoo.build(variant, d_model=hp["d_model"], num_heads=hp["heads"], **variant.quality_options).double()
    query, key, value = (torch.randn(2, n, hp["d_model"], dtype=torch.float64) for _ in range(3))
    causal = variant.tags.causal_only
    with torch.no_grad():
        out = module(query, key, value, is_causal=causal)
        heads = [x.unflatten(-1, (hp["heads"], -1)).transpose(1, 2) for x in (query, key, value)]
        dense = F.scaled_dot_product_attention(*heads, is_causal=causal).transpose(1, 2).flatten(2)
    return relative_error(out, dense)


def dense_on_tasks(variant, hp: dict, seed: int):
    """A ``reduces-to`` row for each task on which the variant, as this suite trains it, computes exactly dense
    softmax attention (a window or blocks covering the task's whole sequence): its scores there are dense
    attention's, which the board says. Only for an attention core that is not dense softmax itself (it differs at
    twice the longest task's length)."""
    if variant.kind != "core":
        return
    tasks = default_tasks()
    longest = 2 * max(task_tokens(task) for task in tasks)
    try:
        if dense_difference(variant, longest, hp, seed) <= DENSE_TOLERANCE:
            return
        for task in tasks:
            n = task_tokens(task)
            difference = dense_difference(variant, n, hp, seed)
            if difference <= DENSE_TOLERANCE:
                yield Result("reduces-to", MEASURED, task.name, difference, "rel. difference",
                             f"at the task's {n} tokens, with the options it trains with, it computes dense softmax "
                             f"attention (relative difference {difference:.1g}): its scores there are dense "
                             "attention's", versus=SDPA, params={"task": task.name})
    except Exception as exc:  # the comparison is a note, never the suite's failure
        yield Result("reduces-to", SKIPPED, detail=f"not compared with dense attention: {type(exc).__name__}: {exc}")


def run_quality(variant, profile):
    """Train on every task over the profile's seeds; accuracy per task and the recall curve; and the tasks on which
    the variant is dense attention."""
    torch.set_num_threads(profile.threads)
    settings = profile.of(SUITE)
    hp = hyper_parameters(profile)
    yield Result("hyper-parameters", MEASURED,
                 detail=", ".join(f"{k}={v}" for k, v in hp.items()) + f"; seeds={settings.seeds}; "
                 f"recall sweep steps={settings.recall_steps}")
    yield from dense_on_tasks(variant, hp, profile.seed)
    for task in default_tasks():
        hp = hyper_parameters(profile, task)
        scores, seconds = [], []
        for seed in range(profile.seed, profile.seed + settings.seeds):
            outcome = train(variant, task, hp, seed, settings.task_max_gflop, profile.device)
            if outcome.skipped:
                yield Result("accuracy", SKIPPED, task.name, detail=outcome.skipped, params={"task": task.name})
                break
            scores.append(outcome.accuracy)
            seconds.append(outcome.seconds)
            yield Result("accuracy-seed", MEASURED, f"{task.name} seed={seed}", outcome.accuracy, "fraction",
                         params={"task": task.name, "seed": seed})
        if not scores:
            continue
        spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
        on_task = {"task": task.name}
        yield Result("accuracy", MEASURED, task.name, statistics.mean(scores), "fraction",
                     f"± {spread:.3f} (std over {len(scores)} seeds); chance {task.chance:.3f}; {task.summary}",
                     params=on_task)
        yield Result("accuracy-std", MEASURED, task.name, spread, "fraction", f"std over {len(scores)} seeds",
                     params=on_task)
        yield Result("chance", MEASURED, task.name, task.chance, "fraction", "accuracy of guessing", params=on_task)
        yield Result("train-seconds", MEASURED, task.name, statistics.mean(seconds), "s",
                     f"mean over {len(seconds)} seeds of {hp['steps']} steps", params=on_task)
        if task.pairs:  # a point of the recall-versus-pairs curve
            yield Result("recall-vs-pairs", MEASURED, f"pairs={task.pairs}", statistics.mean(scores), "fraction",
                         f"{task.summary}; {hp['steps']} steps, mean over {len(scores)} seeds", n=task.pairs)
            state = recall_state_bytes(variant, task, hp)
            if state is not None:
                yield Result("recall-state-bytes", MEASURED, f"pairs={task.pairs}", state, "bytes",
                             f"the decoding state of the task's model at its length {task.length}: {hp['layers']} "
                             "layer(s) x the plugin's state_bytes formula (float32, one sequence)", n=task.pairs)
    yield from run_state_dials(variant, profile)


def recall_state_bytes(variant, task: Task, hp: dict, options: dict | None = None) -> float | None:
    """What the recall task's model would keep per sequence while decoding at the task's length (None: the variant
    does not decode or declares no formula): Based's recall-versus-state-size axis."""
    decoder = variant.decoder
    if decoder is None or decoder.state_bytes is None:
        return None
    options = variant.quality_options if options is None else options
    return hp["layers"] * float(decoder.state_bytes(1, task.length, hp["d_model"], hp["heads"], itemsize=4,
                                                    **{**variant.options, **options}))


def run_state_dials(variant, profile):
    """The hardest recall task trained again at each value of each option that dials the variant's state
    (:attr:`zoo.Variant.state_dials`), the rest as it trains with: recall and state per setting."""
    settings = profile.of(SUITE)
    recall = [task for task in default_tasks() if task.pairs]
    if not variant.state_dials or not recall:
        return
    task = max(recall, key=lambda t: t.pairs)
    hp = hyper_parameters(profile, task)
    for option, values in variant.state_dials.items():
        for value in values:
            options = {**variant.quality_options, option: value}
            outcomes = [train(variant, task, hp, seed, settings.task_max_gflop, profile.device, options)
                        for seed in range(profile.seed, profile.seed + settings.seeds)]
            setting, params = f"pairs={task.pairs} {option}={value}", {"option": option, "value": value}
            skipped = next((o.skipped for o in outcomes if o.skipped), None)
            if skipped:
                yield Result("recall-dial", SKIPPED, setting, detail=skipped, params=params)
                continue
            yield Result("recall-dial", MEASURED, setting, statistics.mean(o.accuracy for o in outcomes), "fraction",
                         f"{task.summary}; {option}={value}, the rest as it trains with; {hp['steps']} steps, mean "
                         f"over {len(outcomes)} seeds", n=task.pairs, params=params)
            yield Result("recall-dial-state-bytes", MEASURED, setting, recall_state_bytes(variant, task, hp, options),
                         "bytes", f"the decoding state of that model at the task's length {task.length}",
                         n=task.pairs, params=params)


# --- on the board ---------------------------------------------------------------------------------------


PER_TASK = ("accuracy", "accuracy-seed", "accuracy-std", "chance", "train-seconds", "reduces-to")
"""The row kinds measured per task: the task's name is in their ``params`` (``task``; ``seed`` too for one seed's)."""


def upgrade(row: dict) -> dict:
    """A stored row as the suite yields it today: a per-task row stored before the task was in ``params`` named it
    only in its setting (``long-copy``, ``long-copy seed=1``)."""
    if row["check"] not in PER_TASK or isinstance(row.get("params"), dict) and "task" in row["params"]:
        return row
    task, _, seed = (row.get("setting") or "").partition(" seed=")
    if not task:  # a row about no task (a comparison that did not run)
        return row
    return {**row, "params": {"task": task, **({"seed": int(seed)} if seed.isdigit() else {})}}


def tasks_of(rows) -> pd.Series:
    """The task each row is about (None for a row about none), from its ``params``."""
    return _param(rows, "task")


def _param(rows, name: str) -> pd.Series:
    """Each row's ``params[name]`` (None where it has none)."""
    return rows.params.map(lambda params: params.get(name) if isinstance(params, dict) else None)


def _value_at(rows, variant, check, task):
    """The value of ``check`` on ``task`` (for one variant, or any), or None."""
    rows = rows[(rows.check == check) & (tasks_of(rows) == task)].dropna(subset=["value"])
    if variant is not None:
        rows = rows[rows.variant == variant]
    return None if rows.empty else float(rows.value.iloc[-1])


def columns(board, variant) -> dict:
    """The variant's mean accuracy over the tasks beside its speed, and the runs it is from."""
    quality = board.rows(SUITE)
    if quality.empty:
        return {}
    source, runs = board.source_text(SUITE), board.runs_of(SUITE)
    earlier = len(set(runs) - {board.run_id})
    named = source if earlier <= 1 else (("this run and " if board.run_id in runs else "")
                                         + f"{earlier} earlier runs, named in the Quality section")
    header = "quality: mean accuracy ± std over seeds" + (f" ({named})" if earlier else "")
    mean, spread = mean_accuracy(board.rows(SUITE, variant))
    card = board.card(variant)
    trained = f" (trained with {options_text(card)})" if card.get("quality_options") else ""
    if mean is not None:
        return {header: f"{mean:.3f}" + ("" if spread is None else f" ± {spread:.1g}") + trained}
    return {header: not_trained(board, variant, source)}


def not_trained(board, variant, source: str) -> str:
    """A missing quality cell: 'not trained', and why where its job did not finish ('not trained: timed out')."""
    unfinished = board.unfinished(SUITE, variant)
    if unfinished is None:
        return "not trained " + board.notes.mark(f"the quality suite did not train {variant} in {source}")
    kind, why = unfinished
    return (f"not trained: {kind} "
            + board.notes.mark(f"the quality suite's job for {variant} did not finish in {source}: {why}"))


def mean_accuracy(rows) -> tuple[float | None, float | None]:
    """A variant's mean accuracy over the tasks (None: not trained) and its spread over seeds (:func:`seed_spread`),
    from its quality rows."""
    scores = rows[rows.check == "accuracy"].dropna(subset=["value"])
    return (None, None) if scores.empty else (float(scores.value.mean()), seed_spread(rows))


def seed_spread(rows) -> float | None:
    """How far the mean accuracy over the tasks moves with the seed: the standard deviation, over the seeds that
    trained every task, of each seed's mean over the tasks (None: fewer than two such seeds)."""
    seeds = rows[rows.check == "accuracy-seed"].dropna(subset=["value"])
    if seeds.empty:
        return None
    keyed = pd.DataFrame({"task": tasks_of(seeds), "seed": _param(seeds, "seed"), "value": seeds.value}).dropna()
    table = keyed.pivot_table(index="seed", columns="task", values="value", aggfunc="last").dropna()
    return float(table.mean(axis=1).std(ddof=1)) if len(table) > 1 else None


def details(board, variant) -> list:
    """The variant page's quality: its accuracy on each task (mean ± spread over seeds) beside chance."""
    quality = board.rows(SUITE)
    if quality.empty:
        return []
    mine = board.rows(SUITE, variant)
    rows = []
    for r in mine[(mine.check == "accuracy") & tasks_of(mine).notna()].itertuples():  # a row of no task: no line
        chance = _value_at(quality, None, "chance", r.params["task"])
        rows.append({"task": r.params["task"], "accuracy": _score_text(mine, r),
                     "chance": "" if chance is None else f"{chance:.3f}"})
    dense = set(tasks_of(mine[(mine.check == "reduces-to") & (mine.status == MEASURED)]))
    for row in rows if dense else []:  # a column only where some task saw dense attention
        row["dense attention here"] = "yes: outputs equal dense SDPA to 1e-10 (float64)" if row["task"] in dense else ""
    return [zoo.Table(f"Quality ({board.source_text(SUITE)})", list(rows[0]), rows)] if rows else []


def _score_text(quality, row) -> str:
    """An accuracy row as the board shows it: mean ± std over seeds, or why it was skipped."""
    if row.status == SKIPPED or pd.isna(row.value):
        return f"skipped: {row.detail}"
    spread = _value_at(quality, row.variant, "accuracy-std", row.params["task"])
    return f"{row.value:.3f}" + ("" if spread is None else f" ± {spread:.3f}")


def options_text(card: dict) -> str:
    """The options a variant trained with here: its plugin's quality options, else its defaults (a run stored
    before plugins gave quality options: not recorded)."""
    if "quality_options" not in card:
        return "not recorded by its run"
    given = card["quality_options"]
    return ", ".join(f"{k}={v}" for k, v in given.items()) if given else "its defaults"


KEEP = 0.05
"""How far below its kind's top mean accuracy a variant may be and still answer "which should I use?" for a reader
who will not give up quality: past the seeds' spread (0.02), well short of the gaps between softmax and the linear
recurrences on the recall tasks."""


def axes(board, variant) -> list[zoo.Axis]:
    """The mean accuracy over the tasks: a cost weighed against speed and state (scores within 0.02 are tied, and
    so are scores whose intervals, one standard deviation over seeds either side (:func:`seed_spread`), overlap);
    each answer also offers the best variant that keeps within :data:`KEEP` of the top score."""
    scores = board.rows(SUITE)
    if scores.empty:
        return []
    mean, spread = mean_accuracy(board.rows(SUITE, variant))
    low, high = (None, None) if spread is None else (mean - spread, mean + spread)
    unfinished = board.unfinished(SUITE, variant)
    missing = "not trained" + (f": {unfinished[0]}" if unfinished else "")
    card = board.card(variant)
    trained = f" (trained with {options_text(card)})" if card.get("quality_options") else ""
    return [zoo.Axis("quality: mean accuracy", mean, "higher", f"{mean:.3f}{trained}" if mean is not None else missing,
                     tie=0.02, keep=KEEP, low=low, high=high)]


def section(board) -> zoo.Section:
    """The quality section: accuracy per task and the recall-versus-pairs curve, with their plots."""
    quality = board.rows(SUITE)
    scores = quality[quality.check == "accuracy"]
    if scores.empty:
        return zoo.Section("Quality", ["_Not in this run: `zoo run-all --suite quality` (or `--profile full`) trains "
                                       "every variant on the synthetic tasks._"])
    tasks = [task for task in dict.fromkeys(tasks_of(scores)) if task is not None]
    rows = []
    for variant in sorted(set(scores.variant)):
        mine = scores[scores.variant == variant]
        row = {"variant": variant, "trained with": options_text(board.card(variant))}
        for task in tasks:
            hit = mine[tasks_of(mine) == task]
            row[task] = _score_text(board.rows(SUITE, variant), next(hit.itertuples())) if not hit.empty else ""
        rows.append(row)
    chance = {task: _value_at(quality, None, "chance", task) for task in tasks}
    rows.append({"variant": "(chance)", "trained with": "", **{t: "" if c is None else f"{c:.3f}" for t, c in chance.items()}})
    hp = pd.Series(quality[quality.check == "hyper-parameters"].detail.unique())
    runs = board.runs_of(SUITE)
    source = board.source_text(SUITE) + ("" if board.run_id in runs else
                                         " (this run did not train them; the latest run that did)")
    figures = {v: board.rank_figure(v) for v in set(scores.variant)}
    absent = sorted(v for v, f in figures.items() if f is None or f.value is None)
    plot_note = (f" The accuracy-versus-speed plot leaves out {', '.join(absent)}: no ranking figure on this board."
                 if absent and len(absent) < len(figures) else "")
    tables = [zoo.Table("", [], rows)]
    reduced = quality[(quality.check == "reduces-to") & (quality.status == MEASURED)]
    if not reduced.empty:
        tables.append(zoo.Table("Where a variant is dense attention", ["variant", "tasks"], [
            {"variant": v, "tasks": ", ".join(dict.fromkeys(tasks_of(reduced[reduced.variant == v])))}
            for v in sorted(set(reduced.variant))], note=[
            "On these tasks the variant, with the options it trains with, computes exactly dense softmax attention "
            "(its output equals torch SDPA's to 1e-10 in float64 at the task's sequence length: its window or "
            "blocks cover the whole sequence), so its scores there are dense attention's and say nothing about "
            "its structure; its other tasks do."]))
    curve = quality[quality.check == "recall-vs-pairs"].dropna(subset=["value", "n"])
    if not curve.empty:
        pairs = sorted(int(p) for p in set(curve.n))
        table = [{"variant": variant, **{f"{p} pairs": fmt_g(_recall_at(curve, variant, p), ".3f") for p in pairs}}
                 for variant in sorted(set(curve.variant))]
        example = curve.sort_values("n").detail.iloc[-1]
        tables.append(zoo.Table("Associative recall versus number of pairs", [], table, note=[
            "Multi-query associative recall (Zoology, Arora et al. 2023) at growing difficulty for a model of "
            "fixed width: more key-value pairs to hold, from a key vocabulary twice their number. Softmax "
            "attention can look each key up exactly; a fixed-size state (linear attention) must compress all "
            f"pairs and is expected to fall behind as they grow. Settings at the largest: {example}."]))
    spread = recall_spread(quality)
    recall = _recall_plot(curve, spread, plots_.unranked(board), tuple(board.variants))
    plots = [plot for plot in (_accuracy_plot(board, quality, figures), recall,
                               _recall_state_plot(board, quality, spread)) if plot]
    return zoo.Section("Quality", [
        f"From {source}.{board.machines_text(SUITE)} Each variant trains with its plugin's quality options "
        "(*trained with*: a window, blocks or "
        "a projection shorter than the tasks' 16-144 tokens, so its structure is exercised; at its defaults it "
        "would be dense attention there). "
        f"Accuracy on fresh examples after training with the same budget and hyper-parameters "
        f"({'; '.join(hp) if not hp.empty else 'see results.csv'}); mean ± std over seeds.{plot_note}"],
        tables, dict(plots))


@plots_.drawn_once
def _pareto_plot(x: pd.Series, y: pd.Series, xlabel: str, ylabel: str, name: str, top: float | None = None,
                 panels: list[tuple[str, str, frozenset]] | None = None, greyed: frozenset = frozenset(),
                 palette: tuple[str, ...] = (), dials: dict[str, list[tuple[float, float, str]]] | None = None,
                 spread: dict[str, tuple[float, float]] | None = None, y_spread: dict[str, float] | None = None,
                 y_spread_label: str = "bar: ± 1 std over the seeds"):
    """One point per variant, x (a cost, log scale, lower is better) against y (higher is better), the Pareto front
    joined: the variants no other beats on both at once; ``panels`` (title, x label, variants) side by side, each
    with its own front, else one; ``greyed`` variants (not ranked) in grey; ``dials``: per variant, (x, y, label)
    points of its other settings, joined to its point by a dotted line in its colour (not on the front, which
    compares the variants as they are); ``spread``: per variant, the (low, high) interval of its x, drawn as a bar;
    ``y_spread``: per variant, the standard deviation of its y over seeds, drawn as a bar of one either side
    (``y_spread_label`` in the legend). Labels never cover a point, the legend or each other
    (:func:`zoo.plots.place_labels`). None when no variant has both."""
    points = pd.DataFrame({"x": x, "y": y}).dropna().sort_values(["x", "y"], ascending=[True, False])
    panels = [(t, label, members) for t, label, members in panels or [("", xlabel, frozenset(points.index))]
              if members & set(points.index)]
    if points.empty or not panels:
        return None
    plt = plots_.pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    styles = plots_.variant_styles(sorted(set(points.index) | set(palette)))
    for ax, (title, label, members) in zip(axes[0], panels):
        mine = points[points.index.isin(members)]
        front = mine[mine.y > mine.y.cummax().shift(fill_value=-1.0)]
        ax.step(front.x, front.y, where="post", color="0.6", linestyle="--", label="Pareto front", zorder=1)
        for variant, point in mine.iterrows():
            color = plots_.GREY if variant in greyed else styles[variant][0]
            ax.scatter(point.x, point.y, marker="o" if variant in front.index else "x", s=40, zorder=2, color=color)
            low, high = (spread or {}).get(variant, (None, None))
            if low is not None and high is not None and low <= point.x <= high:
                ax.errorbar(point.x, point.y, xerr=[[point.x - low], [high - point.x]], fmt="none", ecolor=color,
                            elinewidth=1, capsize=2, alpha=0.7, zorder=2)
            std = (y_spread or {}).get(variant)
            if std is not None and std > 0:
                ax.errorbar(point.x, point.y, yerr=std, fmt="none", ecolor=color, elinewidth=1, capsize=2, alpha=0.7,
                            zorder=2)
        # each point named, then its dial's settings: the variants get the nearest free places
        plots_.label_points(ax, [(point.x, point.y, variant) for variant, point in mine.iterrows()
                                 if variant not in greyed])
        plots_.label_points(ax, [(point.x, point.y, variant + " (not ranked)")
                                 for variant, point in mine.iterrows() if variant in greyed], color="0.45")
        for variant, settings in (dials or {}).items():
            if variant not in mine.index or not settings:
                continue
            line = sorted([(mine.x[variant], mine.y[variant])] + [(x, y) for x, y, _ in settings])
            color = plots_.GREY if variant in greyed else styles[variant][0]
            ax.plot([x for x, _ in line], [y for _, y in line], linestyle=":", marker=".", zorder=1, color=color)
            plots_.label_points(ax, [(x, y, f"{variant} {label}") for x, y, label in settings],
                                color="0.45" if variant in greyed else "black")
        if dials:
            ax.plot([], [], linestyle=":", marker=".", color="0.3", label="a variant's state dial (other options)")
        for marker, meaning in (("o", "on the front"), ("x", "behind it: another is better on both")):
            ax.scatter([], [], marker=marker, color="0.3", label=meaning)
        if spread:
            ax.errorbar([], [], xerr=[[], []], fmt="none", ecolor="0.3", capsize=2,
                        label="bar: the ratio's interval (processes, earlier runs)")
        if any((y_spread or {}).get(v, 0) > 0 for v in mine.index):
            ax.errorbar([], [], yerr=[[], []], fmt="none", ecolor="0.3", capsize=2, label=y_spread_label)
        if greyed & set(mine.index):
            ax.scatter([], [], marker="o", color=plots_.GREY, label="grey: not ranked on this board")
        ax.set_xscale("log")
        ax.set_xlabel(label, fontsize=8 if len(label) > 70 else None)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if top is not None:
            ax.set_ylim(0, top)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return plots_.save(plt, fig, name)


def _accuracy_plot(board, quality, figures):
    """Mean accuracy over tasks against the ranking figure, cores and layers apart, each against its own
    comparator as the ranked tables are, with its Pareto front."""
    from zoo.board import KIND_TITLES

    scores = quality[quality.check == "accuracy"].dropna(subset=["value"])
    if scores.empty:
        return None
    accuracy = scores.groupby("variant").value.mean()
    ranked = {v: f for v, f in figures.items() if f is not None and f.value is not None}
    if not ranked:
        x = quality[quality.check == "train-seconds"].groupby("variant").value.sum().reindex(accuracy.index)
        return _pareto_plot(x, accuracy, "training seconds over all tasks (lower is faster)",
                            "mean accuracy over the quality tasks", "accuracy-vs-speed.png",
                            palette=tuple(board.variants), y_spread=_seed_spreads(quality),
                            y_spread_label="bar: ± 1 std over seeds of the mean accuracy")
    x = pd.Series({v: f.value for v, f in ranked.items()}).reindex(accuracy.index)
    panels = []
    for kind, title in KIND_TITLES.items():
        members = frozenset(v for v in ranked if board.kind(v) == kind)
        if members:
            columns = sorted({ranked[v].column for v in members})
            panels.append((title, "; ".join(columns) + " (lower is faster)", members))
    spread = {v: (f.low, f.high) for v, f in ranked.items()}
    return _pareto_plot(x, accuracy, "", "mean accuracy over the quality tasks", "accuracy-vs-speed.png",
                        panels=panels, greyed=plots_.unranked(board), palette=tuple(board.variants), spread=spread,
                        y_spread=_seed_spreads(quality), y_spread_label="bar: ± 1 std over seeds of the mean accuracy")


def _seed_spreads(quality) -> dict[str, float]:
    """Each variant's :func:`seed_spread` (where it has one: two or more seeds that trained every task)."""
    spreads = {variant: seed_spread(quality[quality.variant == variant]) for variant in set(quality.variant)}
    return {variant: spread for variant, spread in spreads.items() if spread is not None}


def recall_spread(quality) -> dict[tuple[str, int], float]:
    """Each variant's standard deviation over seeds of its recall at each number of pairs (the recall curve's n),
    from the recall tasks' ``accuracy-seed`` rows: only where two or more seeds trained that task."""
    pairs_of = {task.name: task.pairs for task in default_tasks() if task.pairs}
    seeds = quality[quality.check == "accuracy-seed"].dropna(subset=["value"])
    if seeds.empty:
        return {}
    keyed = pd.DataFrame({"variant": seeds.variant, "task": tasks_of(seeds), "seed": _param(seeds, "seed"),
                          "value": seeds.value}).dropna()
    keyed = keyed[keyed.task.isin(pairs_of)]
    scores = keyed.groupby(["variant", "task", "seed"]).value.last()  # a seed stored twice: its latest
    return {(variant, pairs_of[task]): float(values.std(ddof=1))
            for (variant, task), values in scores.groupby(level=["variant", "task"]) if len(values) > 1}


def _recall_state_plot(board, quality, spread: dict[tuple[str, int], float]):
    """Recall at the largest number of pairs against the state the task's model keeps per sequence while decoding,
    one point per variant that decodes, with its Pareto front (Based, Arora et al. 2024: the recall a state
    size buys); each variant in its board-wide colour, grey where the board does not rank it, a bar of one standard
    deviation over the seeds where two or more trained."""
    states = quality[quality.check == "recall-state-bytes"].dropna(subset=["value", "n"])
    curve = quality[quality.check == "recall-vs-pairs"].dropna(subset=["value", "n"])
    if states.empty or curve.empty:
        return None
    pairs = int(curve.n.max())
    recall = curve[curve.n == pairs].groupby("variant").value.last()
    state = states[states.n == pairs].groupby("variant").value.last()
    dial_recall = quality[(quality.check == "recall-dial") & (quality.n == pairs)].dropna(subset=["value"])
    dial_state = quality[(quality.check == "recall-dial-state-bytes") & (quality.n == pairs)].dropna(subset=["value"])
    state_of = {(row.variant, row.params["option"], row.params["value"]): row.value
                for row in dial_state.itertuples() if isinstance(row.params, dict)}
    dials = {}
    for row in dial_recall.itertuples():
        key = (row.variant, row.params["option"], row.params["value"]) if isinstance(row.params, dict) else None
        if key in state_of:
            dials.setdefault(row.variant, []).append((float(state_of[key]), float(row.value), f"{key[1]}={key[2]}"))
    spread = {variant: std for (variant, at), std in spread.items() if at == pairs}
    return _pareto_plot(state, recall, "decoding state per sequence of the recall model at the task's length (bytes)",
                        f"associative recall at {pairs} pairs", "recall-vs-state.png", top=1.02, dials=dials,
                        greyed=plots_.unranked(board), palette=tuple(board.variants), y_spread=spread,
                        y_spread_label="bar: ± 1 std over the seeds")


def _recall_at(curve, variant, pairs):
    """The variant's recall at ``pairs`` key-value pairs (the curve's ``n``), or None."""
    hit = curve[(curve.variant == variant) & (curve.n == pairs)].dropna(subset=["value"])
    return None if hit.empty else float(hit.value.iloc[-1])


@plots_.drawn_once
def _recall_plot(curve, spread: dict[tuple[str, int], float], greyed: frozenset, palette: tuple[str, ...]):
    """Recall against the number of pairs, one line per variant in the style its name has on every plot (grey and
    dotted where the board does not rank it: ``greyed``; ``palette``: every variant of the board), with a bar of one
    standard deviation over the seeds at each point where two or more trained (``spread``:
    :func:`recall_spread`); the legend beside the axes, off the data."""
    if curve.empty:
        return None
    plt = plots_.pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    styles = plots_.variant_styles(sorted(set(curve.variant) | set(palette)))  # as on every other plot
    for variant, series in curve.groupby("variant"):
        series = series.sort_values("n")
        color, marker, dashes = plots_.GREY_STYLE if variant in greyed else styles[variant]
        ranked = variant not in greyed
        ax.plot(series.n.astype(float), series.value, color=color, marker=marker, linestyle=dashes,
                label=variant if ranked else f"{variant} (not ranked)", zorder=2 if ranked else 1)
        bars = [(float(n), float(value), spread[(variant, int(n))]) for n, value in zip(series.n, series.value)
                if spread.get((variant, int(n)), 0) > 0]
        if bars:
            ax.errorbar([n for n, _, _ in bars], [v for _, v, _ in bars], yerr=[s for _, _, s in bars], fmt="none",
                        ecolor=color, elinewidth=1, capsize=2, alpha=0.6, zorder=2 if ranked else 1)
    if spread:
        ax.errorbar([], [], yerr=[[], []], fmt="none", ecolor="0.3", capsize=2, label="bar: ± 1 std over the seeds")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(curve.n.astype(float))), [str(int(p)) for p in sorted(set(curve.n))])
    ax.set_xlabel("key-value pairs to recall (key vocabulary grows with them; model width fixed)")
    ax.set_ylabel("recall accuracy on fresh examples")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the data, not on it
    return plots_.save(plt, fig, "recall-vs-pairs.png")


SUITE_DEFINITION = zoo.Suite(
    SUITE, "what a variant can learn: accuracy on synthetic tasks after the same training budget", measures=(
        zoo.Measure("accuracy", "mean accuracy on fresh examples over seeds, per task", "fraction"),
        zoo.Measure("accuracy-seed", "accuracy of one seed", "fraction"),
        zoo.Measure("accuracy-std", "standard deviation of the accuracy over seeds", "fraction"),
        zoo.Measure("chance", "the accuracy of guessing, per task", "fraction"),
        zoo.Measure("train-seconds", "training time per task, mean over seeds", "s"),
        zoo.Measure("recall-vs-pairs", "associative recall accuracy at a number of key-value pairs", "fraction"),
        zoo.Measure("recall-state-bytes", "the decoding state per sequence of that recall task's model at its length, "
                    "from the plugin's state_bytes formula", "bytes"),
        zoo.Measure("recall-dial", "recall at the most pairs, trained with another value of an option that sizes "
                    "the state (params: option, value)", "fraction"),
        zoo.Measure("recall-dial-state-bytes", "the decoding state of that model (params: option, value)", "bytes"),
        zoo.Measure("hyper-parameters", "the training budget and hyper-parameters, the same for every variant"),
        zoo.Measure("reduces-to", "a task on which the variant, with the options it trains with, computes exactly dense "
                    "softmax attention (versus: torch-sdpa)", "rel. difference")),
    profiles=("full",), carried=True, section=section, columns=columns, details=details, axes=axes, upgrade=upgrade,
    order=40,
    # the training budget per task; a task whose counted training FLOPs (one step, counted, times the steps)
    # exceed task_max_gflop is skipped before it starts (None: no cap)
    settings={"steps": 300, "recall_steps": 600, "seeds": 2, "task_max_gflop": 5000.0},
    presets={"full": {"steps": 600, "recall_steps": 1500, "seeds": 3, "task_max_gflop": 20000.0},  # 1500: long
             # enough for softmax attention to learn the 32-pair setting here
             "smoke": {"steps": 20, "recall_steps": 20, "seeds": 1, "task_max_gflop": None}},
    legacy={"quality_steps": "steps", "quality_recall_steps": "recall_steps", "quality_seeds": "seeds",
            "quality_task_max_gflop": "task_max_gflop"})


@zoo.hookimpl
def zoo_register_suites(register):
    register(SUITE_DEFINITION)


@zoo.hookimpl
def zoo_register_checks(register):
    register(Check("quality", SUITE, "accuracy on synthetic tasks (associative recall at 8-32 pairs, long/local copy, shapes)",
                   run_quality))
