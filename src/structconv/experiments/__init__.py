"""Recipes that train models to reproduce published numbers (``structconv reproduce NAME``)."""
