import os
import textwrap
from pathlib import Path

# One thread per process, here and in every `python -m zoo` the tests start (they inherit it): with other
# work on the cores, OpenMP's spin-waiting threads made the suite 2-3x slower. Tests assert behaviour, so
# the thread count changes no outcome; the smoke profile pins its workers to one thread for the same reason.
os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch
from hypothesis import settings

import zoo
from zoo.registry import ENV_BLOCK, ENV_NO_AUTOLOAD, ENV_ONLY, ENV_PLUGINS_DIR


torch.set_num_threads(1)

# Every property test draws the same examples on every run (and reads no example database a failed run left),
# so the suite's outcome never depends on a draw.
settings.register_profile("zoo", derandomize=True, database=None)
settings.load_profile("zoo")

BUILTINS = ("additive", "based", "block-sparse", "cross", "differential", "dot-product", "forgetting", "gated-deltanet", "gla",
            "grouped-query", "linear",
            "linformer", "mamba2", "mla", "multi-head",
            "multi-query", "native-sparse", "performer", "retention", "rotary", "sinks", "windowed")
"""The built-in variants, in the order `zoo list` gives them: one file each in plugins/."""


@pytest.fixture(autouse=True)
def clean_plugin_env(monkeypatch):
    """Tests build their own registries; the developer's own plugin settings must not leak in."""
    for name in (ENV_ONLY, ENV_BLOCK, ENV_NO_AUTOLOAD, ENV_PLUGINS_DIR):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def registry():
    return zoo.load_registry()


@pytest.fixture
def write_plugin(tmp_path):
    """write_plugin(name, source) -> the plugins directory holding ``name.py``."""
    directory = tmp_path / "plugins"
    directory.mkdir(exist_ok=True)

    def write(name: str, source: str) -> Path:
        (directory / f"{name}.py").write_text(textwrap.dedent(source))
        return directory

    return write


PLAIN_PLUGIN = '''
import zoo
from zoo.functional import masked_sdpa, merge_heads, split_heads
from zoo.reference import reference_mask, softmax_attention
from torch import nn


class Plain(nn.Module):
    def __init__(self, d_model, num_heads=1):
        super().__init__()
        self.num_heads = num_heads
{init}
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
{before}
        h = self.num_heads
        out = merge_heads(masked_sdpa(split_heads(query, h), split_heads(key, h), split_heads(value, h), attn_mask, {causal}))
        return {output}


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    h = module.num_heads
    heads = [x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value)]
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    out = softmax_attention(*heads, mask).transpose(1, 2).flatten(2)
    return {reference_output}

{hookimpl}
def zoo_register_variants(register):
    register(zoo.Variant(name="{name}", summary="A test variant.", family="softmax", citation="none",
                         factory=Plain, reference=reference, complexity=zoo.Complexity(time=2, memory=1), {variant}))
'''


KILL_THE_RUNNER = """
import os, signal
with open(f"/proc/{os.getppid()}/stat") as stat:  # a worker's parent is the run's launcher; the launcher's, the runner
    os.kill(int(stat.read().rsplit(")", 1)[1].split()[1]), signal.SIGKILL)"""
"""Statements for a plugin's code: kill the process that runs the worker's jobs (``zoo run``, or a Ray task), as
kill -9 would."""


def good_plugin(name: str, *, init: str = "", before: str = "", causal: str = "is_causal", output: str = "out",
                reference_output: str = "out", variant: str = "", hookimpl: bool = True) -> str:
    """The source of a plain softmax-attention plugin named ``name``, as a plugin file holds it, or of a faulty
    twin: ``init`` / ``before`` run (as statements) at the end of ``__init__`` / the start of ``forward``;
    ``causal`` is what it passes as is_causal; ``output`` / ``reference_output`` are what forward / the reference
    return, of ``out``; ``variant`` adds keyword arguments to its zoo.Variant; ``hookimpl=False`` leaves out the
    hook marker."""
    def body(code: str) -> str:
        return textwrap.indent(textwrap.dedent(code).strip("\n"), " " * 8) + "\n" if code.strip() else ""

    return PLAIN_PLUGIN.format(name=name, init=body(init), before=body(before), causal=causal, output=output,
                               reference_output=reference_output, variant=variant,
                               hookimpl="@zoo.hookimpl" if hookimpl else "")


def minimal_variant(**changes) -> zoo.Variant:
    """A registrable variant with nothing behind it (an identity module, a reference that returns None), for
    tests of the contract and the planner; ``changes`` replace its fields."""
    from torch import nn

    fields = dict(name="good", summary="s", family="f", citation="c", factory=lambda d_model, num_heads=1: nn.Identity(),
                  reference=lambda *a, **k: None)
    return zoo.Variant(**{**fields, **changes})


def board_with_a_timed_out_job(tmp_path, registry, profile, suite: str, measured: tuple[str, list],
                               timed_out: str, why: str, kind: str | None = "timed out"):
    """A board of one run: ``measured`` (variant, its rows as dicts) done, and ``timed_out``'s job of ``suite``
    ended by its worker's row saying ``why`` (``kind``: the row's typed kind; None: stored before rows named it)."""
    from zoo.board import Board
    from zoo.checks import ERROR, WORKER_CHECK, Result
    from zoo.store import Store

    tmp_path.mkdir(parents=True, exist_ok=True)
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run(profile.as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    variant, rows = measured
    store.record_job(run, variant, suite, "done", 1.0, {"card": registry.variant(variant).card()}, rows)
    failure = Result(WORKER_CHECK, ERROR, detail=why, params={"unfinished": kind} if kind else None)
    store.record_job(run, timed_out, suite, ERROR, 900.0, {"card": registry.variant(timed_out).card()},
                     [failure.as_dict()])
    return Board.of(store, run, registry.suites)


def run_python(*args, env=None, inherit=True, cwd=None, timeout=600, check=False):
    """``python ARGS`` in a child process, the one way the tests start one: its output captured as text; ``env``
    adds to this process's environment, with the tests' own modules on its path (plugin files the tests write
    import their twins from ``twins``); ``inherit=False``: ``env`` replaces it; ``check``: a failure raises."""
    import subprocess
    import sys

    environment = env
    if inherit:
        environment = {**os.environ, **(env or {})}
        tests = str(Path(__file__).resolve().parent)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, (tests, environment.get("PYTHONPATH"))))
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=environment,
                          cwd=cwd, timeout=timeout, check=check)


def zoo_here(capsys, *args) -> tuple[int, list[str]]:
    """``zoo ARGS`` in this process, where a subprocess would assert nothing more: its exit status (argparse's
    own exit too) and its stderr lines."""
    from zoo.cli import main

    try:
        status = main([str(a) for a in args])
    except SystemExit as exit_:
        status = exit_.code
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def run_zoo(*args, env=None, timeout=600, inherit=True):
    """``python -m zoo ARGS`` as a user runs it (see :func:`run_python`)."""
    return run_python("-m", "zoo", *args, env=env, inherit=inherit, timeout=timeout)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """A real smoke-profile run of an exact core, an approximate one and a layer, all suites but quality:
    (store, run id)."""
    from zoo.store import Store

    out = tmp_path_factory.mktemp("smoke-run")
    done = run_zoo("run", "dot-product", "linear", "multi-head", "--profile", "smoke", "--out", out)
    assert done.returncode == 0, done.stderr
    store = Store(out / "results.sqlite")
    return store, store.latest_run()
