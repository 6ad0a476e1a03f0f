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
GHSA_ALPHABET = "23456789cfghjmpqrvwx"
ACCEPTED = "OWNER/REPO#NUMBER (vllm-project/vllm#54505), CVE-YYYY-NNNN, or GHSA-xxxx-xxxx-xxxx"
HINT = f"a fix id is {ACCEPTED}"


def kind(text: str) -> str | None:
    """`upstream`, `cve` or `ghsa` for a well-formed fix id; None for anything else."""
    for name, pattern in (("upstream", UPSTREAM), ("cve", CVE), ("ghsa", GHSA)):
        if pattern.fullmatch(text):
            return name
    return None


def is_advisory(text: str) -> bool:
    """A vulnerability id a scanner matches (what VEX speaks about), as opposed to an upstream change."""
    return kind(text) in ("cve", "ghsa")


def why_not(text: str) -> str:
    """Why `text` is no fix id, in words that say what is allowed (a GHSA id's alphabet included)."""
    if text.upper().startswith("GHSA"):
        return (
            f"{text!r} is not a GHSA id: GHSA- then three groups of four characters, each one of "
            f"{GHSA_ALPHABET} (lowercase; no 0, 1, a, b, …), joined by '-', e.g. GHSA-j8r2-6x86-q33q"
        )
    if text.upper().startswith("CVE"):
        return f"{text!r} is not a CVE id: CVE-YYYY-NNNN (a year from 1999, then four or more digits)"
    return f"{text!r} is not a fix id: use {ACCEPTED}"
