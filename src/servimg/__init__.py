"""servimg: reproducible, provably-patched serving images for vLLM + LMCache."""

__version__ = "0.1.0"
