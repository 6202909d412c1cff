"""Shift-matrix bases of N-d grids (CNN layers) and average pooling."""

__all__: list[str] = []
