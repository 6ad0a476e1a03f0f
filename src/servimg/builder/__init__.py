"""The build pipeline (definition, resolve, lock, plan, assemble, verify, publish) and its seams."""
