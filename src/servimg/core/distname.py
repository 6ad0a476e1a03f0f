"""Distribution names as packaging compares them."""

from __future__ import annotations

import re


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (what pip resolves by and the pypi purl type requires)."""
    return re.sub(r"[-_.]+", "-", name).lower()
