"""A daemon thread that samples something every few seconds while a benchmark runs (load average, RSS)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from typing_extensions import Self


class BackgroundSampler(ABC):
    """Calls :meth:`sample` every ``interval`` seconds between ``__enter__`` and ``__exit__`` (and once at each end),
    so a value that changes during a run is seen in between, not only at its ends."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.sample()

    @abstractmethod
    def sample(self) -> None:
        """Take one sample (a subclass stores it)."""

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
