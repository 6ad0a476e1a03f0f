"""The proof: the probe spec a build writes into the image, and the stdlib-only in-image probe run over the
image's own filesystem (in a container, a chroot, or the warm overlay root over exactly its layers)."""
