"""The formats statements take at a place, written and read back: cosign's tags and bundles, OCI 1.1
referrers of DSSE envelopes, and publishing every format beside an image."""
