"""Hydra entry points."""
