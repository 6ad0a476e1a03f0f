"""Tools that write definitions and overlays for a person: `servimg init` (a skeleton from your own image),
`servimg overlay edit|save`, `servimg rebase`, and the in-place YAML edits they share."""
