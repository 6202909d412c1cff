"""Datasets: loaders that parse real files into tensors, and a registry by name."""

from .registry import DATASETS, dataset_names, load_dataset, register_dataset

__all__ = ["DATASETS", "dataset_names", "load_dataset", "register_dataset"]
