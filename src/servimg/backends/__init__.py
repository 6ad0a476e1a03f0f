"""Sources and sinks of images: Docker Engine, OCI registry, OCI layout, archives."""
