#!/usr/bin/env python3
"""Generate the hybrid ladders' frozen probe sets (run once; the ladder pins each by sha256).

    .venv/bin/python scripts/make-hybrid-probes.py                    # verify/probes/cpu-hybrid.json
    .venv/bin/python scripts/make-hybrid-probes.py --set cpu-connector  # verify/probes/cpu-connector.json

`cpu-connector` is the seed incident's order (issue 47; verify/ladders/cpu-connector.yaml): P900, P600 and
P300 are prefixes of one token sequence, Q750 is 640 of P900's tokens and 110 others; an arm sends the four,
then the four again. After P900's one prefill the attention group holds 256-token blocks the recurrent
group has no state for, so P600 and P300 (and Q750's 512) are local hits deeper than the recurrent state.

The hybrid models (servimg.ladder.tinymodel: `tiny-hybrids`) cache in 256-token blocks on CPU (vLLM's align
mode), and a prefix-cache hit must restore the recurrent state at the block edge, not only the attention
KV. Their weights are random, so a probe has no expected text: every arm must equal its model family's
control token for token and logprob for logprob. Two kinds of prompt family, both with words drawn from the
copy model's vocabulary (the hybrids share its tokenizer):

- nested (`n*`): `<s> S[:299]`, `<s> S[:599]`, `<s> S[:879]` (300, 600, 880 tokens). The second hits the
  first block (state at 256), the third the first two (state at 512); the third's answer lies 368 tokens
  beyond what the second held, so a stale state cannot answer by accident.
- diverging (`d*`): `<s> T[:849]` (850 tokens, cold: one prefill writes three attention blocks but a Mamba
  state only at its checkpoint, 768), then `<s> T[:599] E` (diverges at 600: attention holds two blocks
  of it, the recurrent layers no state at 256 or 512, so the correct hit is 0), then `<s> T[:849] E'`
  (hits 768). A scheduler that lets the attention group's hit stand for the model (before
  vllm-project/vllm#48425) starts the second from 512 with no recurrent state for it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

from servimg.ladder.tinymodel import BOS, TinyModelRecipe, decode

SEED = 38
FIRST_WORD = 4  # after the special tokens
NESTED = (299, 599, 879)


def words(rng: random.Random, recipe: TinyModelRecipe, n: int) -> list[int]:
    return [rng.randrange(FIRST_WORD, recipe.vocab_size) for _ in range(n)]


def prompt(recipe: TinyModelRecipe, family: str, index: int, ids: list[int]) -> dict[str, object]:
    return {"id": f"{family}-p{index}", "token_ids": ids, "text": decode(recipe, ids)}


def build(recipe: TinyModelRecipe) -> dict[str, object]:
    rng = random.Random(SEED)
    families = []
    for f in range(2):
        context = words(rng, recipe, max(NESTED))
        families.append(
            {
                "id": f"n{f}",
                "description": "nested: 300, 600 and 880 tokens of one context; hits at 256 and 512",
                "prompts": [prompt(recipe, f"n{f}", i, [BOS, *context[:n]]) for i, n in enumerate(NESTED)],
            }
        )
    context = words(rng, recipe, 849)
    tails = words(rng, recipe, 150), words(rng, recipe, 20)
    families.append(
        {
            "id": "d0",
            "description": "diverging: 850 tokens cold, then 600 of them + 150 others (attention holds "
            "512 of it, the recurrent layers nothing), then all 850 + 20 others (hits 768)",
            "prompts": [
                prompt(recipe, "d0", 0, [BOS, *context]),
                prompt(recipe, "d0", 1, [BOS, *context[:599], *tails[0]]),
                prompt(recipe, "d0", 2, [BOS, *context, *tails[1]]),
            ],
        }
    )
    return {
        "probe_set_version": 1,
        "name": "cpu-hybrid",
        "description": "prefix re-use across the 256-token block edge for servimg's tiny hybrid models "
        "(random weights: compared with the control bit-exactly, no expected text)",
        "tokenizer": f"servimg tiny-copy vocabulary sha256:{recipe.tokenizer_key()}",
        "families": families,
    }


def build_connector(recipe: TinyModelRecipe) -> dict[str, object]:
    rng = random.Random(SEED + 1)
    sequence, others = words(rng, recipe, 899), words(rng, recipe, 110)
    prompts = [
        {"id": f"p{n}", "token_ids": ids, "text": decode(recipe, ids)}
        for n, ids in (
            (900, [BOS, *sequence]),
            (600, [BOS, *sequence[:599]]),
            (300, [BOS, *sequence[:299]]),
            (750, [BOS, *sequence[:639], *others]),
        )
    ]
    prompts[3]["id"] = "q750"
    return {
        "probe_set_version": 1,
        "name": "cpu-connector",
        "description": "the seed incident's prompts (issue 47): P900, P600, P300 (prefixes of one sequence), "
        "Q750 (640 of P900's tokens + 110 others); random weights: compared with the control bit-exactly",
        "tokenizer": f"servimg tiny-copy vocabulary sha256:{recipe.tokenizer_key()}",
        "families": [
            {
                "id": "s0",
                "description": "one sequence: its prefixes, longest first, then a diverging prompt",
                "prompts": prompts,
            }
        ],
    }


BUILDERS = {"cpu-hybrid": build, "cpu-connector": build_connector}


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=sorted(BUILDERS), default="cpu-hybrid")
    ap.add_argument("--out", type=Path, help="default: verify/probes/<set>.json")
    args = ap.parse_args()
    args.out = args.out or repo / "verify" / "probes" / f"{args.set}.json"
    data = (json.dumps(BUILDERS[args.set](TinyModelRecipe()), indent=1, sort_keys=True) + "\n").encode()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"{args.out}: sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
