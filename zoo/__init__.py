"""attention-zoo: a plugin-based zoo of attention mechanisms for PyTorch, and the harness that ranks them.

Importing ``zoo`` is cheap (no torch); the API functions load torch and the plugins on first use.
"""

from .checks import Check, Result, requires
from .contract import Complexity, Departure, Origin, RandomFeatures, Tags, Target, Variant, ZooError
from .decoding import Decoder
from .hookspecs import hookimpl
from .suite import Axis, Measure, RankFigure, Ranking, Section, Suite, Table

__version__ = "0.1.0"

_LAZY = {
    "create": "api", "build": "api", "list_variants": "api", "default_registry": "api",
    "load_registry": "registry", "Registry": "registry", "run": "harness",
}

__all__ = ["Axis", "Check", "Complexity", "Decoder", "Departure", "Measure", "Origin", "RandomFeatures", "RankFigure", "Ranking", "Result", "Section", "Suite", "Table", "Tags",
           "Target", "Variant", "ZooError", "hookimpl", "requires", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
