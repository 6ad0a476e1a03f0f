"""Locally built bases as pure functions of pinned inputs: Debian pins, recipes, committed digests."""
