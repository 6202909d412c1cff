"""Recipes that train models to reproduce published numbers (``structconv reproduce NAME``)."""

#: modules of this package shared by the recipes, not recipes themselves
SHARED = ("sweep",)
