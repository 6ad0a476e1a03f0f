"""A third-party module imported on first use, for the few whose import is expensive and which many
commands never touch (the Docker SDK, requests: ≈0.1–0.2 s each): `requests = LazyModule("requests")`
at module level reads like the import it replaces, and the first attribute looked up on it imports it.
A servimg module is never imported this way (tests/test_architecture.py keeps those at module level)."""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """A stand-in for module `name`: each attribute is read from the module, imported at the first."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
