"""Bases: families of K matrices (M, N) that carry the structure of a convolution.

Generic bases live in ``base``; grid shift matrices in ``grid``; graph and relational bases
in ``graph``; random-walk sorts by name and their mining in ``sorts``. Attention bases
(computed from content) are in ``sc.attention``.
"""

from .base import Basis, Dense, Product, Sparse, Stack, as_basis, density
from .batch import READOUTS, Readout, adjacency, readout
from .graph import *  # noqa: F403
from .graph import __all__ as _graph_all
from .grid import *  # noqa: F403
from .grid import __all__ as _grid_all
from .kinds import (
    BASES,
    KindError,
    Sampled,
    Structure,
    as_spec,
    build,
    check,
    identity,
    register,
    sampled,
    with_defaults,
)
from .mining import MinedSort, mine_sorts, single_and_mined_sorts
from .shift import Shift
from .sorts import INVERSE, inverse_name, parse_sorts, sort_name
from .typed import TypedBasis, metapath_basis, metapath_edges, parse_metapath, typed_basis
from .typed_mining import MinedMetapath, metapath_name, mine_metapaths

__all__ = ["Basis", "Dense", "Sparse", "Stack", "Product", "as_basis", "density",
           *_grid_all, *_graph_all,
           "register", "build", "check", "Structure", "BASES", "KindError", "Sampled", "as_spec",
           "with_defaults", "sampled", "identity",
           "mine_sorts", "MinedSort", "single_and_mined_sorts", "parse_sorts", "sort_name",
           "inverse_name", "INVERSE",
           "readout", "Readout", "adjacency", "READOUTS",
           "TypedBasis", "typed_basis", "metapath_basis", "metapath_edges", "parse_metapath",
           "mine_metapaths", "MinedMetapath", "metapath_name",
           "Shift"]
