"""Molecules from SMILES (MoleculeNet HIV) as graphs with OGB's categorical features (RDKit).

Atoms: 9 categorical features with the vocabularies of OGB's ``smiles2graph`` (atomic number
1..118, chirality tag, total degree 0..10, formal charge -5..5, total hydrogens 0..8, radical
electrons 0..4, hybridization SP..SP3D2, aromatic, in a ring; a value outside a vocabulary
takes its last, "misc", index). Bonds: type (single, double, triple, aromatic, misc), stereo
(none, Z, E, cis, trans, any) and conjugated, both directions of each bond in bond order.
The split is Bemis-Murcko scaffold based (RDKit's ``MurckoScaffoldSmiles`` with chirality):
scaffold groups by decreasing size (ties: the first molecule's index, descending) fill train
to 80%, then valid to 10%, the rest test, as the deepchem procedure behind OGB's split. OGB's
own split files are not used: call it "OGB-like" (see the guide for how the sizes compare).
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from .._extras import require
from .batch import GraphDataset
from .registry import DatasetError, check_int, register_dataset

__all__ = ["ATOM_VOCABULARIES", "BOND_VOCABULARIES", "ATOM_FEATURE_DIMS", "BOND_FEATURE_DIMS",
           "atom_features", "bond_features", "smiles_graph", "molecules", "scaffold_split",
           "one_hot", "read_hiv", "parse"]

_MISC = "misc"
ATOM_VOCABULARIES = (
    [*range(1, 119), _MISC],
    ["CHI_UNSPECIFIED", "CHI_TETRAHEDRAL_CW", "CHI_TETRAHEDRAL_CCW", "CHI_OTHER", _MISC],
    [*range(11), _MISC],
    [*range(-5, 6), _MISC],
    [*range(9), _MISC],
    [*range(5), _MISC],
    ["SP", "SP2", "SP3", "SP3D", "SP3D2", _MISC],
    [False, True],
    [False, True],
)
"""OGB's atom vocabularies, one per feature column (the last entry of each takes the rest)."""
BOND_VOCABULARIES = (
    ["SINGLE", "DOUBLE", "TRIPLE", "AROMATIC", _MISC],
    ["STEREONONE", "STEREOZ", "STEREOE", "STEREOCIS", "STEREOTRANS", "STEREOANY"],
    [False, True],
)
"""OGB's bond vocabularies: type, stereo, conjugated."""
ATOM_FEATURE_DIMS = tuple(len(v) for v in ATOM_VOCABULARIES)
"""The number of categories of each atom feature (OGB's ``get_atom_feature_dims``)."""
BOND_FEATURE_DIMS = tuple(len(v) for v in BOND_VOCABULARIES)
"""The number of categories of each bond feature."""

_ATOM_INDEX = [{v: i for i, v in enumerate(voc)} for voc in ATOM_VOCABULARIES]
_BOND_INDEX = [{v: i for i, v in enumerate(voc)} for voc in BOND_VOCABULARIES]


def _lookup(table: dict, value, strict: bool) -> int:
    hit = table.get(value)
    if hit is None:
        if strict:
            raise ValueError(f"value {value!r} is outside the vocabulary")
        return len(table) - 1
    return hit


def atom_features(atom) -> list[int]:
    """OGB's 9 categorical indices of an RDKit atom."""
    values = (atom.GetAtomicNum(), str(atom.GetChiralTag()), atom.GetTotalDegree(),
              atom.GetFormalCharge(), atom.GetTotalNumHs(), atom.GetNumRadicalElectrons(),
              str(atom.GetHybridization()), atom.GetIsAromatic(), atom.IsInRing())
    strict = (False,) * 7 + (True, True)
    return [_lookup(t, v, s) for t, v, s in zip(_ATOM_INDEX, values, strict)]


def bond_features(bond) -> list[int]:
    """OGB's 3 categorical indices of an RDKit bond (stereo and conjugation have no "misc")."""
    values = (str(bond.GetBondType()), str(bond.GetStereo()), bond.GetIsConjugated())
    return [_lookup(t, v, s) for t, v, s in zip(_BOND_INDEX, values, (False, True, True))]


def parse(smiles: str, chem=None):
    """An RDKit molecule from SMILES; where RDKit's valence check refuses it (recent RDKit
    refuses a few hypervalent Al / B / Ge atoms of MoleculeNet's HIV that OGB's older RDKit
    took), it is sanitised without that check. None where even that fails."""
    chem = chem or require("rdkit.Chem", "mol", "molecules from SMILES")
    mol = chem.MolFromSmiles(smiles)
    if mol is not None:
        return mol
    mol = chem.MolFromSmiles(smiles, sanitize=False)
    if mol is None:
        return None
    try:
        mol.UpdatePropertyCache(strict=False)
        chem.SanitizeMol(mol, chem.SanitizeFlags.SANITIZE_ALL ^
                         chem.SanitizeFlags.SANITIZE_PROPERTIES)
    except Exception:  # RDKit raises its own exception types here
        return None
    return mol


def smiles_graph(smiles: str, chem=None) -> dict | None:
    """A molecule as a graph dict: x (n, 9) long, edge_index (2, 2b) (both directions of each
    bond, in bond order), edge_attr (2b, 3) long; None where RDKit cannot parse the SMILES."""
    mol = parse(smiles, chem)
    if mol is None:
        return None
    x = torch.tensor([atom_features(a) for a in mol.GetAtoms()], dtype=torch.long)
    pairs, feats = [], []
    for b in mol.GetBonds():
        i, j, f = b.GetBeginAtomIdx(), b.GetEndAtomIdx(), bond_features(b)
        pairs += [(i, j), (j, i)]
        feats += [f, f]
    ei = torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1)
    ea = torch.tensor(feats, dtype=torch.long).reshape(-1, len(BOND_VOCABULARIES))
    return {"x": x.reshape(-1, len(ATOM_VOCABULARIES)), "edge_index": ei, "edge_attr": ea}


def molecules(smiles: list[str], y: torch.Tensor, name: str = "molecules") -> GraphDataset:
    """A ``GraphDataset`` of molecules (``x`` / ``edge_attr`` categorical long columns);
    ``splits`` holds the scaffold split. A SMILES RDKit cannot parse is an error."""
    chem = require("rdkit.Chem", "mol", "molecules from SMILES")
    require("rdkit.RDLogger", "mol", "molecules from SMILES").DisableLog("rdApp.*")
    graphs = []
    for i, s in enumerate(smiles):
        g = smiles_graph(s, chem)
        if g is None:
            raise DatasetError(f"{name}: RDKit cannot parse the SMILES of molecule {i}: {s!r}")
        graphs.append(g)
    ds = GraphDataset.from_graphs(graphs, name=name, num_classes=2)
    ds.y = y
    ds.splits = scaffold_split(smiles)
    # the categorical columns' sizes: a model one-hot encodes them (OGB's embeddings' inputs)
    ds.feature_dims, ds.edge_feature_dims = ATOM_FEATURE_DIMS, BOND_FEATURE_DIMS
    return ds


def _scaffold(smiles: str, chem, murcko) -> str:
    """The Bemis-Murcko scaffold SMILES (with chirality); a molecule whose scaffold RDKit's
    valence check refuses is its own group (keyed by its SMILES)."""
    mol = parse(smiles, chem)
    if mol is None:
        return smiles
    try:
        return murcko.MurckoScaffoldSmiles(mol=mol, includeChirality=True)
    except Exception:  # RDKit's valence exceptions (hypervalent Al / B / Ge)
        return smiles


def scaffold_split(smiles: list[str], frac_train: float = 0.8, frac_valid: float = 0.1
                   ) -> dict[str, torch.Tensor]:
    """Bemis-Murcko scaffold split (deterministic): {"train", "valid", "test"} ids."""
    chem = require("rdkit.Chem", "mol", "scaffold splits")
    murcko = require("rdkit.Chem.Scaffolds.MurckoScaffold", "mol", "scaffold splits")
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(smiles):
        groups.setdefault(_scaffold(s, chem, murcko), []).append(i)
    order = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    n = len(smiles)
    train, valid, test = [], [], []
    for g in order:
        if len(train) + len(g) <= frac_train * n:
            train += g
        elif len(train) + len(valid) + len(g) <= (frac_train + frac_valid) * n:
            valid += g
        else:
            test += g
    return {k: torch.tensor(sorted(v), dtype=torch.long)
            for k, v in (("train", train), ("valid", valid), ("test", test))}


def one_hot(categorical: torch.Tensor, dims) -> torch.Tensor:
    """Categorical columns (n, len(dims)) long -> their one-hot codes side by side, float
    (n, Σ dims): e.g. ``one_hot(ds.x, ATOM_FEATURE_DIMS)`` for a model without embeddings."""
    offsets = torch.tensor([0, *dims[:-1]], device=categorical.device).cumsum(0)
    out = torch.zeros(categorical.shape[0], sum(dims), device=categorical.device)
    if categorical.numel():
        out.scatter_(1, categorical + offsets, 1.0)
    return out


def read_hiv(path: Path) -> tuple[list[str], torch.Tensor]:
    """(SMILES, labels (n,) long) of MoleculeNet's HIV.csv (header smiles,activity,HIV_active;
    blank lines skipped)."""
    if not path.is_file():
        raise DatasetError(f"HIV file {path} is missing")
    with path.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    if not rows or rows[0][:1] != ["smiles"] or "HIV_active" not in rows[0]:
        raise DatasetError(f"{path}: expected the header smiles,activity,HIV_active")
    col = rows[0].index("HIV_active")
    try:
        y = torch.tensor([int(r[col]) for r in rows[1:]], dtype=torch.long)
    except (ValueError, IndexError) as e:
        raise DatasetError(f"{path}: a row has no integer HIV_active label ({e})") from None
    return [r[0] for r in rows[1:]], y


@register_dataset("hiv", "molecules", "MoleculeNet HIV molecules from SMILES (RDKit), OGB's "
                  "atom / bond features, scaffold split; limit=N loads the first N",
                  files=["HIV.csv"])
def load_hiv(root, limit: int | None = None) -> GraphDataset:
    smiles, y = read_hiv(Path(root) / "HIV.csv")
    if limit is not None:
        limit = check_int("hiv", "limit", limit, low=1)
        smiles, y = smiles[:limit], y[:limit]
    return molecules(smiles, y, name="hiv")
