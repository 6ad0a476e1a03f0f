"""The one build path: a plan made once at the command edge, resolve (base scan, overlays, interpreter),
assemble one deterministic layer per platform, prove each image whole, and publish it through the sink."""
