"""The image as a value: manifest and config bytes, deterministic layers, blob store, merged filesystem."""
