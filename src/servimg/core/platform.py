"""A platform (`linux/amd64`, `linux/arm64`): the OCI image-index entry's `platform`, as a type; and the
host as a value (`Host`: its platform, and whether an engine answers and overlays mount).

Only the platforms servimg can build and probe are accepted (`SUPPORTED`): Linux on amd64 and arm64, the
two architectures vLLM's own images cover. The OCI names and Debian's architecture names coincide for
both, and so do CPython's `platform.machine()` values after the kernel's (x86_64, aarch64) are mapped.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from servimg.core.errors import UsageError

SUPPORTED = ("linux/amd64", "linux/arm64")
_MACHINES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True, order=True)
class Platform:
    os: str
    architecture: str

    @classmethod
    def parse(cls, text: str) -> Platform:
        """`os/arch` (one of SUPPORTED), or UsageError saying which ones are."""
        value = text.strip()
        if value not in SUPPORTED:
            raise UsageError(
                f"unsupported platform {text!r}",
                hint=f"use one of: {', '.join(SUPPORTED)}",
            )
        os_name, _, arch = value.partition("/")
        return cls(os_name, arch)

    @classmethod
    def optional(cls, text: str | None) -> Platform | None:
        """A `--platform` flag's value: None when the flag was not given."""
        return cls.parse(text) if text else None

    @classmethod
    def parse_list(cls, text: str) -> tuple[Platform, ...]:
        """A comma-separated list (`linux/amd64,linux/arm64`), each once, in the order given."""
        found: list[Platform] = []
        for part in text.split(","):
            chosen = cls.parse(part)
            if chosen in found:
                raise UsageError(f"platform {chosen} given twice", hint="name each platform once")
            found.append(chosen)
        return tuple(found)

    @classmethod
    def host(cls) -> Platform:
        """The platform this machine runs natively."""
        machine = os.uname().machine
        return cls("linux", _MACHINES.get(machine, machine))

    @classmethod
    def of_config(cls, config: Mapping[str, object]) -> Platform:
        """The platform an image config says it is for (`os`, `architecture`)."""
        return cls(str(config.get("os") or "linux"), str(config.get("architecture") or ""))

    @property
    def debian_arch(self) -> str:
        return self.architecture

    @property
    def emulated(self) -> bool:
        """Whether running this platform's binaries here needs emulation (qemu-user via binfmt_misc)."""
        return self != Platform.host()

    def index_entry(self) -> dict[str, str]:
        """The `platform` object of an OCI image-index entry."""
        return {"architecture": self.architecture, "os": self.os}

    def __str__(self) -> str:
        return f"{self.os}/{self.architecture}"


def texts(platforms: Iterable[Platform]) -> str:
    return ", ".join(str(p) for p in platforms)


# What this host can do, as one value: whether a Docker Engine answers, whether overlays mount in a
# private namespace (the warm root), and the platform it runs natively. Made once per command
# (`assembly.defaults.probe_host`) and passed to whatever chooses by it: the default seams (which runner
# compiles, where the probe runs), the default build target, where a base is published. Each capability
# is asked at most once, when first needed: asking for the engine imports the Docker SDK and pings the
# daemon, which a build from and to OCI layouts never needs. Issue 49: the engine alone was asked at
# seven sites, each at its own moment.
@dataclass(frozen=True)
class Host:
    ask_engine: Callable[[], bool]  # does a Docker Engine answer?
    ask_overlays: Callable[[], bool]  # does overlayfs mount in a private mount namespace (the warm root)?
    platform: Platform  # what this machine runs natively

    @classmethod
    def known(cls, *, engine: bool, overlays: bool, platform: Platform | None = None) -> Host:
        """A host whose answers are already known (a caller that asked, tests)."""
        return cls(lambda: engine, lambda: overlays, platform or Platform.host())

    @functools.cached_property
    def engine(self) -> bool:
        return self.ask_engine()

    @functools.cached_property
    def overlays(self) -> bool:
        return self.ask_overlays()
