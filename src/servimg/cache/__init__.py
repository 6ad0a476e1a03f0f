"""servimg's cache, one room: where it lives (`location`), what lies where (`layout`), what it holds
and prunes (`state`, `bases`), the hold a running command keeps on it (`hold`), and results filed by
the digest of every input (`results`)."""
