"""One subpackage per paper: its prompts, its data-construction stages and its inference pipeline."""
