"""What an overlay says it fixes (definition `fixes:`): an upstream reference or an advisory id, one
spelling each, so that `servimg fixes`, `check --require-fix` and VEX name a fix the same way.

- an upstream change or issue: `OWNER/REPO#NUMBER` (`vllm-project/vllm#54505`), GitHub's own short form;
- a CVE: `CVE-YYYY-NNNN` (four or more digits: CVE's id syntax since 2014);
- a GitHub security advisory: `GHSA-xxxx-xxxx-xxxx` (each group four of `23456789cfghjmpqrvwx`).
"""

from __future__ import annotations

import re

UPSTREAM = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}#[1-9][0-9]{0,9}")
CVE = re.compile(r"CVE-(?:19|20)[0-9]{2}-[0-9]{4,19}")
GHSA = re.compile(r"GHSA(?:-[23456789cfghjmpqrvwx]{4}){3}")
ACCEPTED = "OWNER/REPO#NUMBER (vllm-project/vllm#54505), CVE-YYYY-NNNN, or GHSA-xxxx-xxxx-xxxx"


def kind(text: str) -> str | None:
    """`upstream`, `cve` or `ghsa` for a well-formed fix id; None for anything else."""
    for name, pattern in (("upstream", UPSTREAM), ("cve", CVE), ("ghsa", GHSA)):
        if pattern.fullmatch(text):
            return name
    return None


def is_advisory(text: str) -> bool:
    """A vulnerability id a scanner matches (what VEX speaks about), as opposed to an upstream change."""
    return kind(text) in ("cve", "ghsa")
