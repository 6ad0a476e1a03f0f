"""Reading user-written YAML strictly: duplicate keys refused, pydantic problems as `yaml.path: message`.

Shared by every definition servimg reads (images/*.yaml, verify/ladders/*.yaml, policies)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails


class StrictLoader(yaml.SafeLoader):
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
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def describe_problem(err: ErrorDetails) -> str:
    """One pydantic error as `yaml.path: message`, the form every definition reports its problems in."""
    path = ""
    for part in err["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("int", "str", "constrained-int", "literal['base']") or str(part).startswith(
            "function-"
        ):
            continue
        else:
            path += ("." if path else "") + str(part)
    msg = err["msg"] or "invalid"
    if err["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; see images/demo.yaml)"
    elif err["type"] == "missing":
        msg = "required key is missing"
    return f"{path or '<root>'}: {msg}"
