"""Graph and relational bases built from an edge_index (GCN, Chebyshev, diffusion, sorts)."""

__all__: list[str] = []
