"""Optional dependencies: imported on use, with one clear line naming the extra to install.

The library itself needs only torch, numpy, safetensors and tqdm; loaders, plots and the demo's
data come in extras (``structconv[graph]``, ``[plots]``, ``[demo]``, ``[pyg]``, ``[all]``).
"""

from __future__ import annotations

import importlib

__all__ = ["MissingExtra", "require"]


class MissingExtra(ImportError):
    """A feature's optional dependency is not installed (the message names the extra)."""


def require(module: str, extra: str, feature: str):
    """``importlib.import_module(module)``, or ``MissingExtra`` naming ``extra`` for ``feature``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise  # the package is there but something inside it failed: not a missing extra
        raise MissingExtra(f"{feature} needs the '{extra}' extra ({top} is not installed): "
                           f"pip install 'structconv[{extra}]'") from None
