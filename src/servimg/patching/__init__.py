"""Patching and bytecode: unified diffs parsed and applied exactly, the image's own interpreter compiling
the patched sources (the `Sandbox` + `compile_in` runners), the compile cache keyed by every input, the
facts a base alone determines, and running another platform's binaries under qemu."""
