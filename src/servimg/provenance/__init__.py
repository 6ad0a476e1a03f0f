"""Signed statements that travel with the digest: DSSE, in-toto/SLSA, referrers, attach, check, keys."""
