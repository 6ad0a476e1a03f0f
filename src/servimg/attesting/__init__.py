"""The signed route: push an image with its attestations, attach later results, promote by policy."""
