"""Where servimg's cache lives when `--cache` names none: $SERVIMG_CACHE, else $XDG_CACHE_HOME/servimg,
else ~/.cache/servimg. Standard library only (the action cache asks it before anything is imported)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    env = os.environ.get("SERVIMG_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servimg"
