"""Probe sets (`verify/probes/<name>.json`): the frozen prompts a ladder sends, in families, with what
each must produce; and the rules between a probe set and the ladder that pins it (`probe_problems`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.errors import LadderError
from servimg.ladder import readers as r

if TYPE_CHECKING:  # the ladder imports this module to load its probe set
    from servimg.ladder.definition import LadderDefinition


@dataclass(frozen=True, kw_only=True)
class Expect:
    """What a correct answer starts with: token ids (compared exactly), else text (stripped prefix)."""

    token_ids: tuple[int, ...] = ()
    text: str = ""

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Expect:
        f = r.shape(value, path, problems, "token_ids, text")
        expect = cls(
            token_ids=f.take("token_ids", r.items(r.integer()), ()), text=f.take("text", r.STRING, "")
        )
        if f.ok and not expect.token_ids and not expect.text.strip():
            problems.append(r.problem(path, "give the expected token_ids or text"))
        f.done()
        return expect


@dataclass(frozen=True, kw_only=True)
class Prompt:
    id: str
    token_ids: tuple[int, ...] = ()  # required when the ladder's probe_tokens is frozen
    text: str
    expect: Expect | None = None

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Prompt:
        f = r.shape(value, path, problems, "id, token_ids, text, expect")
        return f.made(
            cls(
                id=f.take("id", r.IDENT),
                token_ids=f.take("token_ids", r.items(r.integer(ge=0)), ()),
                text=f.take("text", r.text(min_length=1)),
                expect=f.take("expect", r.optional(Expect.read), None),
            )
        )


@dataclass(frozen=True, kw_only=True)
class Family:
    """Prompts sharing a prefix: the first warms the cache, the later ones re-use it across a block edge."""

    id: str
    description: str = ""
    prompts: tuple[Prompt, ...]

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Family:
        f = r.shape(value, path, problems, "id, description, prompts")
        return f.made(
            cls(
                description=f.take("description", r.STRING, ""),
                id=f.take("id", r.IDENT),
                prompts=f.take("prompts", r.items(Prompt.read, min_length=1)),
            )
        )


@dataclass(frozen=True, kw_only=True)
class ProbeSet:
    probe_set_version: Literal[1] = 1
    name: str
    description: str = ""
    tokenizer: str = ""  # what the token ids are for (e.g. the tiny model's recipe key)
    families: tuple[Family, ...]

    @property
    def prompts(self) -> tuple[tuple[Family, Prompt], ...]:
        return tuple((f, p) for f in self.families for p in f.prompts)

    def as_json(self) -> dict[str, object]:
        return dict(jv.obj(canonical.plain(self)))

    @classmethod
    def parse(cls, data: bytes, *, origin: str = "<probes>") -> ProbeSet:
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            raise LadderError(f"{origin}: not valid JSON", hint="regenerate the probe set") from None
        problems: list[str] = []
        probes = r.read(cls.read, doc, "", problems)
        if probes is None:
            raise LadderError(f"{origin}: {len(problems)} problem(s) in the probe set", problems=problems)
        return probes

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> ProbeSet:
        f = r.shape(value, path, problems, "a probe set")
        probes = cls(
            probe_set_version=f.take("probe_set_version", r.version(1), 1),  # type: ignore[arg-type]
            name=f.take("name", r.IDENT),
            description=f.take("description", r.STRING, ""),
            tokenizer=f.take("tokenizer", r.STRING, ""),
            families=f.take("families", r.items(Family.read, min_length=1)),
        )
        if probes.families is not None:
            ids = [p.id for fam in probes.families for p in fam.prompts] + [fam.id for fam in probes.families]
            dups = sorted({i for i in ids if ids.count(i) > 1})
            if dups:
                problems.append(
                    r.problem(
                        "families", f"ids must be unique across families and prompts: {', '.join(dups)}"
                    )
                )
        f.done()
        return probes


def send_keys(prompt_ids: Sequence[str]) -> list[str]:
    """A key per request of an arm that may send a prompt more than once: `<id>`, then `<id>@2` …"""
    seen: dict[str, int] = {}
    keys = []
    for prompt_id in prompt_ids:
        seen[prompt_id] = seen.get(prompt_id, 0) + 1
        keys.append(prompt_id if seen[prompt_id] == 1 else f"{prompt_id}@{seen[prompt_id]}")
    return keys


def common_prefix(a: tuple[object, ...], b: tuple[object, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def probe_problems(ladder: LadderDefinition, probes: ProbeSet) -> list[str]:
    """A family must re-use a prefix across a cache-block edge, or no arm can exercise the cache; every
    prompt plus its answer must fit the tokens the expectation names."""
    block = ladder.cache_block_tokens
    frozen = ladder.probe_tokens == "frozen"
    # Text probes: a token holds at least one character, so a shared text prefix shorter than a block
    # in characters cannot hold a block of tokens (a necessary condition only).
    unit = "tokens" if frozen else "characters"
    problems = []
    for family in probes.families:
        if len(family.prompts) < 2:
            problems.append(f"family {family.id}: needs at least 2 prompts sharing a prefix")
            continue
        seqs: list[tuple[object, ...]] = [p.token_ids if frozen else tuple(p.text) for p in family.prompts]
        shared = min(common_prefix(a, b) for a, b in itertools.pairwise(seqs))
        if shared < block:
            problems.append(
                f"family {family.id}: its prompts share {shared} {unit}, less than one cache block "
                f"({block} tokens): no prompt can hit the prefix cache"
            )
        if max(len(s) for s in seqs) <= block:
            problems.append(f"family {family.id}: no prompt is longer than one block ({block} tokens)")
    known = {prompt.id for _, prompt in probes.prompts}
    for arm in ladder.arms:
        unknown = [p for p in arm.prompts if p not in known]
        if unknown:
            problems.append(f"arm {arm.id}: prompts {', '.join(unknown)} are not in the probe set")
    for family, prompt in probes.prompts:
        if frozen and not prompt.token_ids:
            problems.append(f"{family.id}/{prompt.id}: no token_ids (the ladder's probe_tokens is frozen)")
        if prompt.expect is not None and len(prompt.expect.token_ids) > ladder.sampling.max_tokens:
            problems.append(
                f"{family.id}/{prompt.id}: expects {len(prompt.expect.token_ids)} tokens, "
                f"max_tokens is {ladder.sampling.max_tokens}"
            )
    return problems
