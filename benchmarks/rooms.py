"""Modules and lines per room of src/servimg, for a checkout (docs/benchmarks.md, "Issue 49").

Usage:
    .venv/bin/python benchmarks/rooms.py [CHECKOUT]    (default: this one)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rooms(checkout: Path) -> dict[str, tuple[int, int]]:
    """Each package folder's (modules, lines), and `(top)` for the modules beside them."""
    root = checkout / "src" / "servimg"
    out = {}
    for folder in sorted(p for p in root.iterdir() if (p / "__init__.py").exists()):
        files = list(folder.glob("*.py"))
        out[folder.name] = (len(files), sum(len(f.read_text().splitlines()) for f in files))
    top = list(root.glob("*.py"))
    out["(top)"] = (len(top), sum(len(f.read_text().splitlines()) for f in top))
    return out


def main() -> int:
    found = rooms(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO)
    print(" ".join(f"{name}={modules}/{lines}" for name, (modules, lines) in found.items()))
    print(f"total {sum(m for m, _ in found.values())} modules, {sum(n for _, n in found.values())} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
