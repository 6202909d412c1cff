"""structconv: every convolution is y = Σ_k A_kᵀ · x · Θ_k.

``x`` (B, M, P) bundle, basis ``A`` (K, M, N) carrying the structure (grid shifts, graph
polynomials, relational sorts, attention), parameter ``Θ`` (K, P, Q) whose size never depends
on M or N. See ``convolve`` and the packages ``basis``, ``params``, ``attention``, ``nn``;
``train(config, out=...)`` trains a model described by a config.
"""

from ._loading import slow_import_notice

with slow_import_notice():  # the command line says so when torch takes long to load
    from . import basis, params
    from .algebra import compose, invert, materialize, mixed_product
    from .engine import ROUTES, convolve, explain, plan

__version__ = "0.1.0"

__all__ = ["convolve", "plan", "explain", "ROUTES", "mixed_product", "materialize", "invert",
           "compose", "basis", "params", "attention", "nn", "kg", "sampling", "data", "train",
           "__version__"]


def __getattr__(name):
    # nn and attention import torch.nn machinery and optional extras: load them on first use
    import importlib

    if name in ("nn", "attention", "data", "kg", "sampling", "training"):
        return importlib.import_module(f".{name}", __name__)
    if name == "train":  # the function structconv.training.train
        return importlib.import_module(".training", __name__).train
    raise AttributeError(f"module 'structconv' has no attribute {name!r}")
