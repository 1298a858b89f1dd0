"""omnimed: training and evaluation for multi-source medical RAG."""

__version__ = "0.1.0"
