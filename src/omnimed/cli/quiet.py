"""A console a researcher can read: each log line once, and none of the notices a user cannot act on.

Lightning gives its loggers their own stderr handler when it is imported before logging is configured, so under
Hydra (which logs to stdout with a timestamp) every Lightning INFO line printed twice; :func:`quiet_console` hands
Lightning's records to the root handlers instead, drops its advertisement for a cloud logger, two deprecation
warnings raised inside transformers and Lightning themselves and the notices below, and keeps FAISS's loader and
bm25s to warnings.
"""

from __future__ import annotations

import logging
import warnings

#: loggers that narrate their own imports or internals at INFO / DEBUG (FAISS's loader names a ModuleNotFoundError
#: for every instruction set it probes): their warnings still show
_CHATTY: tuple[str, ...] = ("faiss.loader", "bm25s")
#: third-party notices that say nothing about the run: (logger name, text in the message). DeepSpeed (imported by
#: transformers' save_pretrained through accelerate) says it found no GPU, which Lightning's first line already
#: said; transformers explains mean_resizing, which omnimed.models.tokens chooses on purpose for added tokens
_DROPPED: tuple[tuple[str, str], ...] = (
    ("lightning.pytorch", "litlogger"),
    ("DeepSpeed", "Setting accelerator to CPU"),
    ("transformers.modeling_utils", "multivariate normal distribution"),
)
#: loggers with handlers of their own (not propagating to the root's), filtered where their records are made
_OWN_HANDLERS: tuple[str, ...] = ("DeepSpeed", "transformers.modeling_utils")
#: warnings raised inside the libraries, not by our calls or about a choice we made: (category, message regex).
#: PEFT saves the embedding layers of an adapter with added tokens, as it should, and says so each time; Lightning's
#: DeepSpeed strategy warns that an overridden configure_gradient_clipping will not clip, but SFTModule overrides it
#: only to clip bf16 gradients around a fused AdamW, and DeepSpeed clips from its own config as intended
_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r".*is_gradient_checkpointing.*"),
    (Warning, r".*isinstance\(treespec, LeafSpec\).*"),
    (UserWarning, r"Setting `save_embedding_layers` to `True` as .*"),
    (Warning, r"Since DeepSpeed handles gradient clipping internally"),
)


class _DropNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and record.name.startswith(_CHATTY):
            return False  # a filter, not a level: bm25s sets its logger to DEBUG when it is imported
        return not any(record.name.startswith(name) and text in record.getMessage() for name, text in _DROPPED)


def quiet_console() -> None:
    """Route Lightning's log records through the root handlers (Hydra's), once, and drop the notices above."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        lg = logging.getLogger(name)
        if logging.getLogger().hasHandlers():
            for handler in [h for h in lg.handlers if type(h) is logging.StreamHandler]:
                lg.removeHandler(handler)
            lg.propagate = True
    drop = _DropNotices()
    # the root's handlers, and the loggers with handlers of their own (a logger's filter stays when the library
    # configures that logger later)
    for filterer in [*logging.getLogger().handlers, *map(logging.getLogger, _OWN_HANDLERS)]:
        if not any(isinstance(f, _DropNotices) for f in filterer.filters):
            filterer.addFilter(drop)
    for category, message in _WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
