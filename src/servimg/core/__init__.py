"""Vocabulary every other part uses: errors, digests, canonical JSON, atomic writes, progress, references."""
