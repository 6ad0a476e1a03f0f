"""The smoke ladder: its definition, the arm runner, pure evaluation, hashed receipts, the tiny model."""
