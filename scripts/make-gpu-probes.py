#!/usr/bin/env python3
"""Generate verify/probes/gpu-needles.json: the GPU ladder's frozen, tokenizer-independent probe set.

    .venv/bin/python scripts/make-gpu-probes.py      # prints the sha256 to pin in the GPU ladder

Real checkpoints bring their own tokenizer, so these probes are TEXT (the ladder says
`probe_tokens: server`: the server tokenizes, and the receipt records the prompt token ids every arm
saw). Each family is one long synthetic document of "The access code of <name> is <number>." facts;
its prompts ask for a code after the first ~35%, ~65% and 100% of the document, so they share a long
prefix (thousands of tokens: many KV blocks, and several Mamba state checkpoints of a hybrid model). The
expected answer is the number, as text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

SEED = 11
FAMILIES = 4
FACTS = 400
SYLLABLES = ["ka", "ri", "mo", "te", "lu", "sa", "no", "vi", "de", "ra", "po", "zu", "mi", "ne", "to", "ba"]


def name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()


def build() -> dict[str, object]:
    rng = random.Random(SEED)
    families = []
    for f in range(FAMILIES):
        names: list[str] = []
        while len(names) < FACTS:
            candidate = name(rng)
            if candidate not in names:
                names.append(candidate)
        codes = [rng.randint(10000, 99999) for _ in names]
        facts = [f"The access code of {n} is {c}." for n, c in zip(names, codes, strict=True)]
        prompts = []
        for p, share in enumerate((0.35, 0.65, 1.0)):
            upto = int(FACTS * share)
            ask = rng.randrange(upto // 3, upto)  # in the later part of what the prompt holds
            document = " ".join(facts[:upto])
            question = f"Question: What is the access code of {names[ask]}?"
            text = f"{document}\n{question}\nAnswer: The access code of {names[ask]} is"
            prompts.append({"id": f"g{f}-p{p}", "text": text, "expect": {"text": str(codes[ask])}})
        families.append(
            {
                "id": f"g{f}",
                "description": f"{FACTS} facts; prompts hold 35%, 65% and 100% of them (nested prefixes)",
                "prompts": prompts,
            }
        )
    return {
        "probe_set_version": 1,
        "name": "gpu-needles",
        "description": "needle retrieval over long nested prefixes, tokenizer-independent (text probes)",
        "tokenizer": "server",
        "families": families,
    }


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=repo / "verify" / "probes" / "gpu-needles.json")
    args = ap.parse_args()
    data = (json.dumps(build(), indent=1, sort_keys=True) + "\n").encode()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"{args.out}: sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
