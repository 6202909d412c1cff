"""Graph-classification data: TU datasets (counts from the datasets README, equality with
PyG's TUDataset, Errica et al.'s folds) and molecules from SMILES (OGB's features, scaffold
split)."""

import pytest
import torch

from structconv.data import GraphDataset, load_dataset
from structconv.data.registry import DatasetError, dataset_dir, missing_files

# the README's table (verified on the files): graphs, class counts, nodes, lines in _A
COUNTS = {"tu-mutag": (188, [63, 125], 3371, 7442),
          "tu-proteins": (1113, [663, 450], 43471, 162088),
          "tu-nci1": (4110, [2053, 2057], 122747, 265506)}


def _need(name):
    missing = missing_files(name)
    if missing:
        pytest.skip(f"{name} is not in the data home: missing {', '.join(missing[:3])}")


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_tu_counts_match_the_readme(name):
    _need(name)
    ds = load_dataset(name)
    G, classes, nodes, lines = COUNTS[name]
    assert isinstance(ds, GraphDataset) and len(ds) == G
    assert torch.bincount(ds.y).tolist() == classes
    assert ds.x.shape[0] == nodes
    assert ds.edge_index.shape[1] == lines  # no self loops or duplicates in these files
    assert len(ds.folds) == 10
    tests = torch.cat([f["test"] for f in ds.folds])
    assert sorted(tests.tolist()) == list(range(G))  # the outer folds partition the graphs
    for f in ds.folds:
        ids = torch.cat([f["train"], f["val"], f["test"]])
        assert ids.unique().numel() == G == ids.numel()


def test_tu_errica_folds_are_read_from_the_split_file():
    _need("tu-nci1")
    ds = load_dataset("tu-nci1")
    assert [len(v) for v in ds.folds[0].values()] == [3328, 370, 412]


def test_tu_equals_pyg_tudataset(tmp_path):
    _need("tu-mutag")
    tud = pytest.importorskip("torch_geometric.datasets")
    from torch_geometric.data import Batch

    raw = tmp_path / "MUTAG" / "raw"
    raw.mkdir(parents=True)
    for f in (dataset_dir("tu-mutag") / "MUTAG").iterdir():
        (raw / f.name).symlink_to(f)
    theirs = Batch.from_data_list(list(tud.TUDataset(str(tmp_path), "MUTAG")))
    ours = load_dataset("tu-mutag").batch()
    for name in ("x", "edge_index", "edge_attr", "y", "batch", "ptr"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name


def test_tu_missing_folder_is_one_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="missing"):
        load_dataset("tu-mutag", root=tmp_path)


def test_stratified_folds_keep_class_ratios():
    from structconv.data.tu import stratified_folds

    y = torch.tensor([0] * 60 + [1] * 30)
    folds = stratified_folds(y, 10, seed=0)
    assert all(torch.bincount(y[f["test"]]).tolist() == [6, 3] for f in folds)
    assert stratified_folds(y, 10, seed=0)[3]["val"].tolist() == folds[3]["val"].tolist()


# -- molecules ------------------------------------------------------------------------------------
def test_ogb_feature_examples():
    chem = pytest.importorskip("rdkit.Chem", reason="the mol extra (rdkit) is not installed")
    from structconv.data.molecules import atom_features, bond_features

    # OGB's own examples in ogb/utils/features.py: the chiral carbon and the stereo double bond
    mol = chem.MolFromSmiles("Cl[C@H](/C=C/C)Br")
    assert atom_features(mol.GetAtomWithIdx(1)) == [5, 2, 4, 5, 1, 0, 2, 0, 0]
    assert bond_features(mol.GetBondWithIdx(2)) == [1, 2, 0]
    # out of vocabulary: the last ("misc") index; aromatic ring atoms
    ion = atom_features(chem.MolFromSmiles("[Si+6]").GetAtomWithIdx(0))
    assert ion[3] == 11 and ion[5] == 5  # charge +6 and 6 radical electrons: "misc"
    assert atom_features(chem.MolFromSmiles("c1ccccc1[Si+5]").GetAtomWithIdx(6))[3] == 10
    og = atom_features(chem.MolFromSmiles("[Og]").GetAtomWithIdx(0))
    assert og[0] == 117 and og[6] == 5  # atomic number 118; hybridization unspecified: "misc"
    benzene = chem.MolFromSmiles("c1ccccc1")
    assert atom_features(benzene.GetAtomWithIdx(0))[7:] == [1, 1]


def test_smiles_graph_shapes():
    pytest.importorskip("rdkit.Chem", reason="the mol extra (rdkit) is not installed")
    from structconv.data.molecules import smiles_graph

    g = smiles_graph("CCO")
    assert g["x"].shape == (3, 9) and g["edge_index"].tolist() == [[0, 1, 1, 2], [1, 0, 2, 1]]
    assert g["edge_attr"].shape == (4, 3)
    single = smiles_graph("[Na+]")
    assert single["edge_index"].shape == (2, 0) and single["edge_attr"].shape == (0, 3)
    assert smiles_graph("not a molecule") is None


def test_hiv_loads_a_few_hundred_with_a_scaffold_split():
    pytest.importorskip("rdkit.Chem", reason="the mol extra (rdkit) is not installed")
    _need("hiv")
    ds = load_dataset("hiv", limit=300)
    assert len(ds) == 300 and ds.x.dtype == torch.long and ds.x.shape[1] == 9
    assert ds.edge_attr.shape[1] == 3 and ds.y.shape == (300,)
    sp = ds.splits
    ids = torch.cat([sp["train"], sp["valid"], sp["test"]])
    assert sorted(ids.tolist()) == list(range(300))
    assert len(sp["train"]) <= 240 and len(sp["train"]) + len(sp["valid"]) <= 270
    from structconv.data.molecules import ATOM_FEATURE_DIMS, one_hot

    oh = one_hot(ds.x, ATOM_FEATURE_DIMS)
    assert oh.shape == (ds.x.shape[0], sum(ATOM_FEATURE_DIMS)) and torch.all(oh.sum(1) == 9)
    # deterministic: the same split again
    assert torch.equal(load_dataset("hiv", limit=300).splits["test"], sp["test"])


def test_scaffold_split_keeps_scaffolds_together():
    chem = pytest.importorskip("rdkit.Chem", reason="the mol extra (rdkit) is not installed")
    from rdkit.Chem.Scaffolds import MurckoScaffold

    from structconv.data.molecules import scaffold_split

    smiles = ["c1ccccc1C", "c1ccccc1CC", "c1ccccc1O", "C1CCCCC1N", "C1CCCCC1C", "CCO", "CCN",
              "c1ccncc1C", "c1ccncc1", "O=C1CCCN1"]
    sp = scaffold_split(smiles, 0.6, 0.2)
    where = {i: k for k, v in sp.items() for i in v.tolist()}
    scaf = [MurckoScaffold.MurckoScaffoldSmiles(mol=chem.MolFromSmiles(s)) for s in smiles]
    for i in range(len(smiles)):
        for j in range(len(smiles)):
            if scaf[i] == scaf[j]:
                assert where[i] == where[j]
    # groups by size (ties: later first molecule first): {0,1,2} {7,8} {5,6} {3,4} {9}; a
    # group goes to train while it fits there, else to valid while that fits, else to test
    assert [sp[k].tolist() for k in ("train", "valid", "test")] == [[0, 1, 2, 7, 8, 9],
                                                                    [5, 6], [3, 4]]
