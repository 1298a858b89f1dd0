"""Methods: one subpackage per paper plus ``baselines/``, each registered in :mod:`.registry`; the shared
:class:`~omnimed.methods.answer.Answer` record and the shared reader (:mod:`.reader`)."""

from omnimed.methods.answer import Answer
from omnimed.methods.registry import Method, Stage, build_method, get_method, method_names, register_method

__all__ = ["Answer", "Method", "Stage", "build_method", "get_method", "method_names", "register_method"]
