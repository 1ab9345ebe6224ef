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

import torch
import torch.nn.functional as F

import zoo
from zoo.blocks import SequenceModel, VisionTransformer
from zoo.checks import MEASURED, SKIPPED, Check, Result
from zoo.measure import count_flops
from zoo.tasks import IGNORE, Task, default_tasks

SUITE = "quality"
EVAL_EXAMPLES = 512
EVAL_SEED = 10_000


def hyper_parameters(profile, task: Task | None = None) -> dict:
    """The same for every variant; the recall sweep trains longer (its hardest setting needs it)."""
    steps = profile.quality_recall_steps if task is not None and task.pairs else profile.quality_steps
    return {"d_model": 64, "heads": 4, "layers": 1, "batch": 32, "steps": steps,
            "optimizer": "AdamW", "lr": 3e-3, "weight_decay": 0.01}


def make_model(variant, task: Task, hp: dict) -> torch.nn.Module:
    size = dict(d_model=hp["d_model"], num_heads=hp["heads"], layers=hp["layers"])
    if task.kind == "image":
        return VisionTransformer(variant, image_size=16, patch_size=4, channels=1, classes=task.classes, **size)
    return SequenceModel(variant, vocab=task.vocab, classes=task.classes, max_len=task.length, **size)


def _loss(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


@torch.no_grad()
def accuracy(model, task: Task, device: str = "cpu") -> float:
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
          device: str = "cpu") -> Training:
    """Train for ``hp['steps']`` steps on ``device`` and score. With ``max_gflop``, a run whose counted
    FLOPs (one training step, counted, times the steps) exceed it is skipped before it starts: a guard
    that reads no clock, so a busy machine never changes which tasks are trained. Data comes from a CPU
    generator, so every device trains on the same examples."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = make_model(variant, task, hp).to(device)
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


def run_quality(variant, profile):
    torch.set_num_threads(profile.threads)
    hp = hyper_parameters(profile)
    yield Result("hyper-parameters", MEASURED,
                 detail=", ".join(f"{k}={v}" for k, v in hp.items()) + f"; seeds={profile.quality_seeds}; "
                 f"recall sweep steps={profile.quality_recall_steps}")
    for task in default_tasks():
        hp = hyper_parameters(profile, task)
        scores, seconds = [], []
        for seed in range(profile.seed, profile.seed + profile.quality_seeds):
            outcome = train(variant, task, hp, seed, profile.quality_task_max_gflop, profile.device)
            if outcome.skipped:
                yield Result("accuracy", SKIPPED, task.name, detail=outcome.skipped)
                break
            scores.append(outcome.accuracy)
            seconds.append(outcome.seconds)
            yield Result("accuracy-seed", MEASURED, f"{task.name} seed={seed}", outcome.accuracy, "fraction")
        if not scores:
            continue
        spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
        yield Result("accuracy", MEASURED, task.name, statistics.mean(scores), "fraction",
                     f"± {spread:.3f} (std over {len(scores)} seeds); chance {task.chance:.3f}; {task.summary}")
        yield Result("accuracy-std", MEASURED, task.name, spread, "fraction", f"std over {len(scores)} seeds")
        yield Result("chance", MEASURED, task.name, task.chance, "fraction", "accuracy of guessing")
        yield Result("train-seconds", MEASURED, task.name, statistics.mean(seconds), "s",
                     f"mean over {len(seconds)} seeds of {hp['steps']} steps")
        if task.pairs:  # a point of the recall-versus-pairs curve
            yield Result("recall-vs-pairs", MEASURED, f"pairs={task.pairs}", statistics.mean(scores), "fraction",
                         f"{task.summary}; {hp['steps']} steps, mean over {len(scores)} seeds", n=task.pairs)


SUITE_DEFINITION = zoo.Suite(
    SUITE, "what a variant can learn: accuracy on synthetic tasks after the same training budget", measures=(
        zoo.Measure("accuracy", "mean accuracy on fresh examples over seeds, per task", "fraction"),
        zoo.Measure("accuracy-seed", "accuracy of one seed", "fraction"),
        zoo.Measure("accuracy-std", "standard deviation of the accuracy over seeds", "fraction"),
        zoo.Measure("chance", "the accuracy of guessing, per task", "fraction"),
        zoo.Measure("train-seconds", "training time per task, mean over seeds", "s"),
        zoo.Measure("recall-vs-pairs", "associative recall accuracy at a number of key-value pairs", "fraction"),
        zoo.Measure("hyper-parameters", "the training budget and hyper-parameters, the same for every variant")),
    profiles=("full",), carried=True, order=40)


@zoo.hookimpl
def zoo_register_suites(register):
    register(SUITE_DEFINITION)


@zoo.hookimpl
def zoo_register_checks(register):
    register(Check("quality", SUITE, "accuracy on synthetic tasks (associative recall at 8-32 pairs, long/local copy, shapes)",
                   run_quality))
