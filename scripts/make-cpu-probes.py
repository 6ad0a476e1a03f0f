#!/usr/bin/env python3
"""Generate verify/probes/cpu-copy.json: the CPU ladder's frozen probe set (run once; the ladder pins it).

    .venv/bin/python scripts/make-cpu-probes.py      # prints the sha256 to pin in verify/ladders/*.yaml

Each family is a context of distinct random words S (the tiny copy model's vocabulary) and three prompts
`<s> S[:n] <sep> S[a]` with n = 150, 220, 290: they share `<s> S[:150]` (151 tokens, past the 128-token
CPU block edge), so the second and third prompts hit the prefix cache. The answer is what followed S[a]
in the context (`S[a+1:a+9]`); the third prompt's answer lies in the SECOND block (prompt positions
128..255) beyond what the second prompt held there: the block a scheduler that over-reports a one-block
hit leaves uncomputed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

from servimg.ladder.tinymodel import BOS, SEP, TinyModelRecipe, decode

SEED = 5
FAMILIES = 3
CONTEXT = 300
ANSWER = 8
# (context length n, range of the queried index a). The third prompt's answer (context words a+1..a+8, at
# prompt positions a+2..a+9) lies in the second 128-token block AND past everything the second prompt
# held there (its context ends at position 220, then <sep>, its query, 8 generated tokens): a block that
# was never computed for it cannot hold the right keys by accident (vLLM reuses a just-freed block first).
PROMPTS = ((150, (20, 120)), (220, (20, 200)), (290, (234, 246)))


def build(recipe: TinyModelRecipe) -> dict[str, object]:
    rng = random.Random(SEED)
    first_word = 4  # after the special tokens
    families = []
    for f in range(FAMILIES):
        context = rng.sample(range(first_word, recipe.vocab_size), CONTEXT)
        prompts = []
        for p, (n, (lo, hi)) in enumerate(PROMPTS):
            a = rng.randint(lo, hi)
            ids = [BOS, *context[:n], SEP, context[a]]
            want = context[a + 1 : a + 1 + ANSWER]
            prompts.append(
                {
                    "id": f"f{f}-p{p}",
                    "token_ids": ids,
                    "text": decode(recipe, ids),
                    "expect": {"token_ids": want, "text": decode(recipe, want)},
                }
            )
        families.append(
            {
                "id": f"f{f}",
                "description": f"context of {CONTEXT} distinct words; the prompts' contexts "
                "(150, 220, 290 words) share the first 150: one full 128-token block + 23",
                "prompts": prompts,
            }
        )
    return {
        "probe_set_version": 1,
        "name": "cpu-copy",
        "description": "copy/needle retrieval for servimg's tiny copy model: the answer follows the queried "
        "word in the context; nested prefixes straddle the 128-token CPU block edge",
        "tokenizer": f"servimg tiny-copy vocabulary sha256:{recipe.tokenizer_key()}",
        "families": families,
    }


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=repo / "verify" / "probes" / "cpu-copy.json")
    args = ap.parse_args()
    data = (json.dumps(build(TinyModelRecipe()), indent=1, sort_keys=True) + "\n").encode()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"{args.out}: sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
