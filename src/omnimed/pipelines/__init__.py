"""Pipelines shared by the papers: the reader, closed-book and retrieve-then-read."""
