"""The baselines every paper compares against, registered as methods: the reader alone (``closed_book``) and the
reader given passages retrieved with the original question (``rag``)."""

from omnimed.methods.baselines import closed_book, rag  # noqa: F401 (registers the methods)
