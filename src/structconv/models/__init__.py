"""Ready-made models built from structconv layers (graph models in ``models.graph``)."""
