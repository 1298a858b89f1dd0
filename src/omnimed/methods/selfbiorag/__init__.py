"""Self-BioRAG (Jeong et al., 2024): reflective tokens, critic and generator data, adaptive retrieval."""

from omnimed.methods.selfbiorag import method  # noqa: F401 (registers pipeline=selfbiorag and its stages)
