"""Loaders that turn public benchmark and corpus layouts into omnimed records."""
