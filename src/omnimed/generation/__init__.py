"""One interface over text-generation backends (HF, vLLM, OpenAI-compatible servers, the world's oracle)."""
