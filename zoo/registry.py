"""The registry: one pluggy PluginManager, the documented load order, and provenance for everything.

Load order (each step registers plugins through the same :meth:`Registry.add_plugin`):

0. the zoo's own suites (``zoo.suites.*``): part of the harness, not subject to ``ZOO_PLUGINS``;
1. the built-in variant plugins (the ``plugins/`` folder, installed as package ``zoo_builtins``);
2. installed distributions declaring an entry point in group ``zoo`` (off with
   ``ZOO_DISABLE_PLUGIN_AUTOLOAD=1``);
3. ``.py`` files from plugin directories (``--plugins-dir DIR`` and ``ZOO_PLUGINS_DIR``, a
   ``os.pathsep``-separated list), in sorted order.

``ZOO_PLUGINS=a,b`` loads only the named plugins (of steps 1-3); ``ZOO_BLOCK_PLUGINS=a,b`` blocks the
named ones of steps 1-3 (the zoo's own suites are part of the harness: ``--suite`` chooses among them). A
plugin that fails to import, registers something invalid, or defines a ``zoo_*`` function that matches no hook
is recorded as a failure; the others still load.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pluggy

from . import hookspecs
from .checks import Check
from .suite import Suite, implicit_suite
from .contract import SOFTMAX, Origin, RegistrationError, UnknownVariantError, Variant, ZooError

ENTRY_POINT_GROUP = hookspecs.PROJECT
ENV_ONLY = "ZOO_PLUGINS"
ENV_BLOCK = "ZOO_BLOCK_PLUGINS"
ENV_NO_AUTOLOAD = "ZOO_DISABLE_PLUGIN_AUTOLOAD"
ENV_PLUGINS_DIR = "ZOO_PLUGINS_DIR"
CORE_PACKAGES = ("zoo.suites",)
BUILTIN_PACKAGE = "zoo_builtins"


class PluginLoadError(ZooError):
    """Raised in strict mode when any plugin failed to load or register."""


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that failed to load or register, and why."""
    plugin: str
    origin: str
    error: str

    def message(self) -> str:
        """The failure in one line."""
        return f"plugin {self.plugin!r} ({self.origin}) failed: {self.error}"


@dataclass
class PluginRecord:
    """What one plugin provided, and where it came from."""
    origin: Origin
    variants: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    suites: list[str] = field(default_factory=list)


class _PluginManager(pluggy.PluginManager):
    """Accepts unmarked functions named like a hook, as pytest does, so a forgotten decorator still works."""

    def parse_hookimpl_opts(self, plugin, name):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("zoo_") and hasattr(self.hook, name):
            if callable(getattr(plugin, name, None)):
                return {}
        return opts


def package_modules(package_name: str) -> list[str]:
    """The public modules of a package (a name starting with '_' is private), sorted: each one plugin."""
    package = importlib.import_module(package_name)
    return [f"{package_name}.{info.name}" for info in sorted(pkgutil.iter_modules(package.__path__),
                                                             key=lambda i: i.name) if not info.name.startswith("_")]


def core_modules() -> list[str]:
    """The zoo's own suite modules, loaded as core plugins (and imported by the launcher before it forks)."""
    return [name for package_name in CORE_PACKAGES for name in package_modules(package_name)]


def _split_env(name: str) -> list[str]:
    return [part.strip() for part in os.environ.get(name, "").split(",") if part.strip()]


def source_hash(path: str | None) -> str:
    """Short sha256 of a plugin's source file, for provenance ('' if unknown)."""
    if not path or not os.path.isfile(path):
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


class Registry:
    """Variants, suites and checks with where each came from; build one with :func:`load_registry`."""

    def __init__(self) -> None:
        self.pm = _PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.variants: dict[str, Variant] = {}
        self.suites: dict[str, Suite] = {}
        self.checks: list[Check] = []
        self.plugins: dict[str, PluginRecord] = {}
        self.failures: list[PluginFailure] = []
        self.only = set(_split_env(ENV_ONLY))
        self.blocked = set(_split_env(ENV_BLOCK))

    # -- loading -------------------------------------------------------------------------------

    def add_plugin(self, plugin: Any, origin: Origin) -> bool:
        """Register one plugin object or module and collect what its hooks register."""
        if self._filtered(origin):
            return False
        if origin.plugin in self.plugins:
            other = self.plugins[origin.plugin].origin
            self._fail(origin, f"a plugin named {origin.plugin!r} is already loaded from {other.label()}")
            return False
        unknown = sorted(
            name for name in dir(plugin)
            if name.startswith("zoo_") and callable(getattr(plugin, name)) and not hasattr(self.pm.hook, name)
        )
        if unknown:
            hooks = ", ".join(sorted(n for n in dir(self.pm.hook) if n.startswith("zoo_")))
            self._fail(origin, f"{', '.join(unknown)} matches no hook (known hooks: {hooks})")
            return False
        try:
            self.pm.register(plugin, name=origin.plugin)
        except Exception as exc:  # pluggy validation errors, duplicate objects
            self._fail(origin, f"{type(exc).__name__}: {exc}")
            return False
        record = self.plugins[origin.plugin] = PluginRecord(origin)
        self._collect(plugin, origin, record)
        return True

    def _collect(self, plugin: Any, origin: Origin, record: PluginRecord) -> None:
        def register_variant(variant: Variant) -> None:
            if not isinstance(variant, Variant):
                raise RegistrationError(f"register() takes a zoo.Variant, got {type(variant).__name__}")
            variant.validate()
            if variant.name in self.variants:
                first = self.variants[variant.name].origin
                raise RegistrationError(
                    f"variant {variant.name!r} is already registered by {first.label()}; "
                    f"this second registration was refused"
                )
            self.variants[variant.name] = dataclasses.replace(variant, origin=origin)
            record.variants.append(variant.name)

        def register_suite(suite: Suite) -> None:
            if not isinstance(suite, Suite):
                raise RegistrationError(f"register() takes a zoo.Suite, got {type(suite).__name__}")
            suite.validate()
            if suite.name in self.suites:
                raise RegistrationError(f"suite {suite.name!r} is already registered by "
                                        f"{self.suites[suite.name].origin.label()}; this second registration was refused")
            self.suites[suite.name] = dataclasses.replace(suite, origin=origin)
            record.suites.append(suite.name)

        def register_check(check: Check) -> None:
            if not isinstance(check, Check):
                raise RegistrationError(f"register() takes a zoo.Check, got {type(check).__name__}")
            check.validate()
            if any(c.suite == check.suite and c.name == check.name for c in self.checks):
                raise RegistrationError(f"check {check.suite}/{check.name} is already registered")
            self.checks.append(dataclasses.replace(check, origin=origin))
            record.checks.append(f"{check.suite}/{check.name}")

        for hook_name, callback in (
            ("zoo_register_variants", register_variant),
            ("zoo_register_suites", register_suite),
            ("zoo_register_checks", register_check),
        ):
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    impl.function(register=_RecordingRegister(callback, self, origin))
                except (Exception, SystemExit) as exc:
                    self._fail(origin, f"{hook_name} raised {type(exc).__name__}: {exc}")

    def resolve_approximations(self) -> None:
        """Give each variant whose ``approximates`` names another variant that variant; a name that is not a
        registered exact attention core is a registration failure of the plugin that used it."""
        for name, variant in list(self.variants.items()):
            target_name = variant.approximates
            if target_name in (None, SOFTMAX):
                continue
            target = self.variants.get(target_name)
            problem = ("is not registered" if target is None else
                       "is itself an approximation" if target.approximates is not None else
                       "has parameters (only an attention core can be compared on the same inputs)"
                       if target.kind != "core" else None)
            if problem is None:
                self.variants[name] = dataclasses.replace(variant, approximated=target)
                continue
            del self.variants[name]
            self.plugins[variant.origin.plugin].variants.remove(name)
            self._fail(variant.origin, f"variant {name!r} approximates {target_name!r}, which {problem}; approximates= "
                                       f"takes {SOFTMAX!r} or the name of a registered exact attention core")

    def _fail(self, origin: Origin, error: str) -> None:
        self.failures.append(PluginFailure(origin.plugin, origin.label(), error))

    def load_module(self, module_name: str, origin_kind: str, plugin_name: str | None = None, **extra: Any) -> None:
        """Import a module by name and add it as a plugin (an import error is a failure)."""
        name = plugin_name or module_name.rsplit(".", 1)[-1]
        origin = Origin(plugin=name, kind=origin_kind, location=module_name, **extra)
        if self._filtered(origin):
            return
        try:
            module = importlib.import_module(module_name)
        except (Exception, SystemExit) as exc:  # a plugin calling sys.exit() must not end the run
            self._fail(origin, f"import raised {type(exc).__name__}: {exc}")
            return
        origin = dataclasses.replace(origin, location=getattr(module, "__file__", None) or module_name)
        self.add_plugin(module, origin)

    def load_core(self) -> None:
        """The zoo's own suites (zoo.suites.*)."""
        for module_name in core_modules():
            name = module_name.rpartition(".")[2]
            if name in self.blocked:
                self.failures.append(PluginFailure(name, "core", f"{ENV_BLOCK}: {name!r} is one of the zoo's own "
                                                   "suites, part of the harness, and was not blocked (choose suites "
                                                   "with --suite)"))
            self.load_module(module_name, "core")

    def load_builtins(self) -> None:
        """The built-in variant plugins (package zoo_builtins)."""
        for module_name in package_modules(BUILTIN_PACKAGE):
            self.load_module(module_name, "builtin")

    def load_entry_points(self) -> None:
        """Installed distributions with an entry point in group zoo."""
        if os.environ.get(ENV_NO_AUTOLOAD, "").strip() not in ("", "0"):
            return
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            origin = Origin(
                plugin=ep.name, kind="entrypoint", location=ep.value,
                distribution=dist.name if dist else None, version=dist.version if dist else None,
            )
            if self._filtered(origin):
                continue
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:
                self._fail(origin, f"import raised {type(exc).__name__}: {exc}")
                continue
            file = getattr(plugin, "__file__", None)
            self.add_plugin(plugin, dataclasses.replace(origin, location=file or ep.value))

    def load_directory(self, directory: str | os.PathLike) -> None:
        """Every .py file of a plugins directory."""
        path = Path(directory)
        if not path.is_dir():
            self.failures.append(PluginFailure(str(path), "plugins directory", "no such directory"))
            return
        for file in sorted(path.glob("*.py")):
            if not file.name.startswith("_"):
                self.load_file(file)

    def load_file(self, file: str | os.PathLike) -> None:
        """Load one ``.py`` file as a plugin named after the file."""
        file = Path(file).resolve()
        name = file.parent.name if file.stem == "__init__" else file.stem  # a package's folder names it
        origin = Origin(plugin=name, kind="file", location=str(file))
        if self._filtered(origin):
            return
        module_name = f"zoo_plugin_file_{name}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
        try:
            spec = importlib.util.spec_from_file_location(module_name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            sys.modules.pop(module_name, None)
            self._fail(origin, f"import raised {type(exc).__name__}: {exc}")
            return
        self.add_plugin(module, origin)

    def _filtered(self, origin: Origin) -> bool:
        """Left out by ZOO_PLUGINS or ZOO_BLOCK_PLUGINS (never a core suite: ``--suite`` chooses among those)."""
        if origin.kind == "core":
            return False
        return origin.plugin in self.blocked or (bool(self.only) and origin.plugin not in self.only)

    # -- lookup --------------------------------------------------------------------------------

    def variant(self, name: str) -> Variant:
        """The registered variant named, or one line with the closest names."""
        if not isinstance(name, str):
            raise UnknownVariantError(f"a variant name must be a string, got {name!r}")
        try:
            return self.variants[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self.variants), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(sorted(self.variants))}"
            raise UnknownVariantError(f"unknown variant {name!r}{hint}") from None

    def list_variants(self, pattern: str | Iterable[str] | None = None) -> list[str]:
        """Sorted variant names matching a wildcard pattern (or any of several), like timm's list_models."""
        names = sorted(self.variants)
        if pattern is None:
            return names
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]

    def checks_for(self, suite: str | None = None) -> list[Check]:
        """The checks of one suite (or all)."""
        return [c for c in self.checks if suite is None or c.suite == suite]

    def suite(self, name: str) -> Suite:
        """A registered suite, or the implicit one of checks that name a suite no plugin describes."""
        return self.suites.get(name) or implicit_suite(name)

    def suite_names(self) -> list[str]:
        """The suites that have checks, in board order (:attr:`Suite.order`, then registration)."""
        named = dict.fromkeys(c.suite for c in self.checks)
        return sorted(named, key=lambda name: self.suite(name).order)


class _RecordingRegister:
    """The ``register`` callback handed to a hook: an invalid registration is recorded, not raised."""

    def __init__(self, callback, registry: Registry, origin: Origin) -> None:
        self._callback, self._registry, self._origin = callback, registry, origin

    def __call__(self, item: Any) -> None:
        try:
            self._callback(item)
        except RegistrationError as exc:
            self._registry._fail(self._origin, str(exc))


def plugin_dirs_from_env() -> list[str]:
    """The plugin folders $ZOO_PLUGINS_DIR names (an os.pathsep-separated list)."""
    return [p for p in os.environ.get(ENV_PLUGINS_DIR, "").split(os.pathsep) if p]


def load_registry(
    plugins_dirs: Iterable[str | os.PathLike] = (),
    *,
    builtins: bool = True,
    entry_points: bool = True,
    strict: bool = False,
) -> Registry:
    """Build a fresh registry in the documented load order."""
    registry = Registry()
    registry.load_core()
    if builtins:
        registry.load_builtins()
    if entry_points:
        registry.load_entry_points()
    for directory in [*plugin_dirs_from_env(), *plugins_dirs]:
        registry.load_directory(directory)
    registry.resolve_approximations()
    if strict and registry.failures:
        raise PluginLoadError("; ".join(f.message() for f in registry.failures))
    return registry
