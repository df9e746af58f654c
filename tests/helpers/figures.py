"""Figures a test reports (cases fuzzed, challenges contained): printed at the end of
every pytest run by ``tests/conftest.py``'s terminal summary, whatever the capture."""

from __future__ import annotations

FIGURES: list[str] = []


def report(line: str) -> None:
    """Keep ``line`` for the run's summary, and print it (seen with ``-s``)."""
    FIGURES.append(line)
    print(line)
