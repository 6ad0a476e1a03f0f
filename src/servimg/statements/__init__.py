"""What a build states about an image, as in-toto statements derived from the image itself: the
statement and predicate types (`attest`), the statements (`derived`), the SBOM, VEX, and what binds a
tag to its lock (`binding`)."""
