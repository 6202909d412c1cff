"""Train from a config in Python: ``sc.train(config, out=...)``, the function behind
``structconv train``.

``config`` is a shipped config's name, a TOML file or a dict (merged over the defaults);
``overrides`` are the command line's ``key=value`` strings. The run directory holds the
metrics, the checkpoint and the best weights, and ``sc.train`` returns the run's result
(the ``result.json`` summary and ``run``, its directory). A dict config describes a model
in the same tables as a TOML file.

    python examples/train_config.py            # 5 epochs of cnn_digits, then a GCN from a dict
    python examples/train_config.py --quick    # 1 epoch each (what CI runs)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import structconv as sc


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one epoch each")
    p.add_argument("--out", default=None, help="where the run directories go (default: a "
                                               "temporary folder)")
    args = p.parse_args(argv)
    epochs = 1 if args.quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        # a shipped config by name, with the command line's overrides
        res = sc.train("cnn_digits", out=root / "cnn", overrides=[f"train.epochs={epochs}"])
        print(f"cnn_digits: {res['parameters']:,} parameters, best epoch {res['best_epoch']}, "
              f"test acc {res['test_acc']:.3f}; run directory holds "
              f"{', '.join(sorted(f.name for f in Path(res['run']).iterdir()))}")
        # a config as a dict: the same tables as a TOML file
        gcn = {"name": "gcn_karate_dict",
               "data": {"name": "karate"},
               "model": {"layers": [
                   {"basis": {"kind": "gcn"}, "channels": 16, "activation": "relu"},
                   {"basis": {"kind": "gcn"}, "channels": "classes"}]},
               "train": {"lr": 0.01, "epochs": 20 * epochs}}
        res = sc.train(gcn, out=root / "gcn", seed=1)
        print(f"{res['model']} on {res['dataset']}: val acc {res['val_acc']:.3f}, "
              f"test acc {res['test_acc']:.3f}")


if __name__ == "__main__":
    main()
