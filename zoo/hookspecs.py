"""The hooks a zoo plugin implements. Each docstring is the reference documentation of its hook.

A plugin is a module (or object) with functions named like these hooks and marked with
``zoo.hookimpl``. Built-in plugins, installed distributions (entry-point group ``zoo``) and ``.py``
files from a plugins directory are all registered the same way.
"""

import pluggy

PROJECT = "zoo"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def zoo_register_variants(register):
    """Register attention variants.

    Call ``register(variant)`` once per :class:`zoo.Variant`. The host validates each one (name pattern,
    callables, tags, complexity, options), records which plugin it came from, and refuses a name that
    another plugin already registered, naming both origins. Return nothing.
    """


@hookspec
def zoo_register_suites(register):
    """Register suites: what a suite is for and how the board shows it.

    Call ``register(suite)`` once per :class:`zoo.Suite`: its name and one-line purpose, the kinds of rows its
    checks yield (:class:`zoo.Measure`), which statuses of its rows keep a variant out of the ranking, whether
    ranking needs it, the profiles it runs in by default, and its board section, its columns in the ranked
    tables and (for the one suite that ranks) the ranking figure, each a function of the board's rows. The
    host refuses a name another plugin registered, naming both origins. The checks themselves come through
    ``zoo_register_checks``. Return nothing.
    """


@hookspec
def zoo_register_checks(register):
    """Register checks and measures that suites run on every variant they apply to.

    Call ``register(check)`` once per :class:`zoo.Check`. A check names its suite (e.g.
    ``correctness``, ``complexity``, ``speed`` or a new one), decides from the variant's
    :class:`zoo.Tags` whether it applies (never from the name), and yields :class:`zoo.Result` rows.
    Return nothing.
    """
