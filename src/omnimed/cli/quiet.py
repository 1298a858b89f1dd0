"""A console a researcher can read: each log line once, and none of the notices a user cannot act on.

Lightning gives its loggers their own stderr handler when it is imported before logging is configured, so under
Hydra (which logs to stdout with a timestamp) every Lightning INFO line printed twice; :func:`quiet_console` hands
Lightning's records to the root handlers instead, drops its advertisement for a cloud logger and two deprecation
warnings raised inside transformers and Lightning themselves, and keeps FAISS's loader and bm25s to warnings.
"""

from __future__ import annotations

import logging
import warnings

#: loggers that narrate their own imports or internals at INFO / DEBUG (FAISS's loader names a ModuleNotFoundError
#: for every instruction set it probes): their warnings still show
_CHATTY: tuple[str, ...] = ("faiss.loader", "bm25s")
#: third-party notices that say nothing about the run: (logger name, text in the message)
_DROPPED: tuple[tuple[str, str], ...] = (("lightning.pytorch", "litlogger"),)
#: deprecation warnings raised inside the libraries, not by our calls: (category, message regex)
_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r".*is_gradient_checkpointing.*"),
    (Warning, r".*isinstance\(treespec, LeafSpec\).*"),
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
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _DropNotices) for f in handler.filters):
            handler.addFilter(drop)
    for category, message in _WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
