"""Kernels apart from bases: the grid's geometry, shift, tap and flat-tap kernels.

A floor below ``structconv.basis``: these modules import torch and each other, never a basis.
"""
