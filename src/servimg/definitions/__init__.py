"""What an image is declared and pinned to be: the definition (`images/<name>.yaml`), its lock (one platform
or several), and the names and labels derived from both. Parsing and validation only: no I/O but reading
and writing those files."""
