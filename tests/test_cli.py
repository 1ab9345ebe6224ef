"""The `zoo` command as a user runs it: in a subprocess, through the console entry point's module."""


import pytest

from conftest import BUILTINS, good_plugin, run_python, run_zoo


def zoo(*args, env=None, timeout=120):
    return run_zoo(*args, env=env, timeout=timeout)


def test_help_is_instant_and_imports_neither_torch_nor_plugins():
    code = "import sys, zoo.cli; zoo.cli.build_parser().format_help(); print('torch' in sys.modules, 'zoo_builtins' in sys.modules)"
    out = run_python("-c", code, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    out = zoo("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"zoo {version('attention-zoo')}"


def test_list_shows_the_builtins_with_origin():
    out = zoo("list")
    assert out.returncode == 0
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert names == list(BUILTINS)
    assert "builtin" in out.stdout


def test_list_pattern(tmp_path):
    assert zoo("list", "*head*").stdout.split()[0] == "multi-head"
    bad = zoo("list", "nope*")
    assert bad.returncode == 2 and "matches no variant" in bad.stderr


def test_dropped_in_plugin_appears_and_a_broken_one_warns_once(write_plugin):
    write_plugin("broken", "import does_not_exist\n")
    directory = write_plugin("mine", good_plugin("my-variant"))
    out = zoo("list", "--plugins-dir", directory)
    assert out.returncode == 0
    assert "my-variant" in out.stdout and "windowed" in out.stdout
    warnings = [line for line in out.stderr.splitlines() if line.startswith("zoo: warning")]
    assert len(warnings) == 1 and "broken" in warnings[0] and "does_not_exist" in warnings[0]
    strict = zoo("list", "--plugins-dir", directory, "--strict")
    assert strict.returncode == 2 and "does_not_exist" in strict.stderr and "Traceback" not in strict.stderr


def test_show_describes_a_variant_and_suggests_on_typos():
    out = zoo("show", "windowed")
    assert out.returncode == 0
    assert "window = 128" in out.stdout and "allows_different_lengths" in out.stdout and "O(n^1)" in out.stdout
    assert "departures from the paper:" in out.stdout and "convention:   window counts keys on each side" in out.stdout
    typo = zoo("show", "windoed")
    assert typo.returncode == 2 and "did you mean windowed" in typo.stderr and "Traceback" not in typo.stderr


def test_plugins_lists_sources_and_failures(write_plugin):
    directory = write_plugin("broken", "raise RuntimeError('nope')\n")
    out = zoo("plugins", "--plugins-dir", directory)
    assert "windowed" in out.stdout and "correctness" in out.stdout
    assert "FAILED broken" in out.stdout and "nope" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--profile", "huge"], "--profile: unknown profile 'huge'"),
    (["--filter", "nothing*"], "--filter: nothing* matches no variant"),
    (["--suite", "nope"], "--suite: unknown suite 'nope'"),
    (["--device", "tpu"], "--device: expected cpu or cuda"),
    (["--out", "/proc/forbidden"], "--out: cannot write"),
    (["--lengths", "0,512"], "--lengths: lengths must be positive"),
    (["--option", "windw=3"], "--option: no selected variant has an option 'windw'"),
    (["--filter", "windowed", "--option", "window=0"], "window must be a positive integer, got 0"),
    (["--filter", "windowed", "--suite", "correctness", "--option", "window=abc"],  # no suite with a shape chosen
     "window must be a positive integer, got 'abc'"),
    (["--d-model", "100", "--heads", "3"], "--d-model/--heads: the complexity suite's d_model 100 is not divisible by its heads 3"),
    (["--device", "cuda", "--memory-limit", "4"], "--memory-limit: not available with --device cuda"),
    (["--suite", "correctness", "--set", "speed.repeats=3"],  # it would change nothing the run measures
     "--set speed.repeats: the speed suite is not in this run (it runs correctness): name it among"),
    (["--set", "quality.steps=5"], "--set quality.steps: the quality suite is not in this run"),
])
def test_bad_run_options_get_one_clear_line_and_status_2(tmp_path, args, message):
    if "--out" not in args:
        args = [*args, "--out", tmp_path / "out"]
    out = zoo("run-all", *args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_argparse_rejects_non_positive_numbers(tmp_path):
    out = zoo("run-all", "--threads", "0", "--out", tmp_path)
    assert out.returncode == 2 and "--threads" in out.stderr


@pytest.mark.parametrize("profile, options", [
    ("quick", {}),
    ("smoke", {"threads": 1, "dtype": "bfloat16", "lengths": [64, 128], "repeats": 2,
               "options": {"window": 16, "mode": "fast"}, "suite_settings": {"speed": {"modes": ["full", "causal"]}}}),
    ("full", {"processes": 1, "d_model": 32, "heads": 2, "suite_settings": {"quality": {"seeds": 1}}}),
])
def test_a_boards_refresh_command_rebuilds_its_runs_settings(profile, options):
    """The options a board prints to measure rows again on its current source give a run with exactly the
    recorded settings (as the store keeps them: JSON), so that run lands on the same board."""
    import json

    from zoo.api import default_registry
    from zoo.cli import _parse_lengths, _parse_options, _parse_settings, build_parser
    from zoo.harness import check_options
    from zoo.profiles import resolve, run_arguments

    suites = default_registry().suites
    base, asked = check_options(profile, **options)
    recorded = json.loads(json.dumps(resolve(base, suites, asked.per_suite(suites)).as_dict()))
    arguments = run_arguments(recorded, suites)
    assert arguments[:2] == ["--profile", profile] and (len(arguments) > 2) == bool(options)
    args = build_parser().parse_args(["run", "dot-product", *arguments])
    base, asked = check_options(args.profile, device=args.device or "cpu", dtype=args.dtype, threads=args.threads,
                                processes=args.processes, options=_parse_options(args.option),
                                lengths=_parse_lengths(args.lengths), suite_settings=_parse_settings(args.set))
    assert json.loads(json.dumps(resolve(base, suites, asked.per_suite(suites)).as_dict())) == recorded


def test_no_refresh_command_is_offered_for_settings_no_option_reaches():
    from zoo.api import default_registry
    from zoo.profiles import get_profile, run_arguments

    suites = default_registry().suites
    seeded = {**get_profile("quick", suites).as_dict(), "seed": 7}
    assert run_arguments(seeded, suites) is None
    assert run_arguments({"name": "quick", "repeats": 5}, suites) is None  # stored flat, before suites nested


def test_check_of_a_scaffolded_variant_not_yet_installed_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from conftest import zoo_here

    monkeypatch.chdir(tmp_path)
    assert zoo_here(capsys, "new", "my-attention")[0] == 0
    status, lines = zoo_here(capsys, "check", "my-attention")
    assert status == 2 and lines == ["zoo: error: TARGET 'my-attention' is not an installed variant: pip install -e "
                                     "zoo-my-attention (what zoo new wrote), or give its .py file (zoo list shows the "
                                     "installed ones)"]
