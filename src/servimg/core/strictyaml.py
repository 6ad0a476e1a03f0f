"""Reading user-written YAML strictly: duplicate keys refused (the values are then read, every problem as
`yaml.path: message`, by servimg.core.fields and servimg.ladder.readers).

Shared by every definition servimg reads (images/*.yaml, verify/ladders/*.yaml, policies)."""

from __future__ import annotations

from typing import Any

import yaml

# libyaml's parser under the same safe constructor and resolver (the same values; ≈8× faster than the
# pure-Python parser, a few hundredths of a second per build), where PyYAML was built with it.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_SAFE_LOADER):  # type: ignore[misc]
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently, hiding edits)."""


def _no_duplicates(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a scalar, not a {type(key).__name__}", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=deep)
    return mapping


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def load_problem(exc: BaseException) -> str:
    """Why a text is not YAML, in words; libyaml's nesting limit and Python's recursion limit alike."""
    if isinstance(exc, RecursionError) or "maximum nesting depth" in str(exc):
        return "nested too deeply"
    return str(exc)
