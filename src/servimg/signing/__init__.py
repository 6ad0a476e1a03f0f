"""Who signs, and the envelope a signature travels in: servimg's keys (ed25519, P-256, cosign's own,
PKCS#11 tokens), DSSE envelopes, and GPG simple signing for containers/image."""
