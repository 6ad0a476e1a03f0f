"""Ladder definitions (`verify/ladders/<name>.yaml`) and probe sets (`verify/probes/<name>.json`).

A ladder is written down BEFORE any arm runs (docs/design.md, "ladder"): arms that change one variable at a
time, a frozen probe set pinned by sha256, thresholds, and exercise gates. This module only parses and
validates; every problem is reported at once with its YAML path, like image definitions. Pure apart from
`load_*`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from servimg.core import canonical
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import ServimgError
from servimg.core.strictyaml import StrictLoader, describe_problem

CACHED_ROLES = ("cold", "warm", "restart")
_ID = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_VAR = re.compile(r"\$\{([a-z_][a-z0-9_]*)\}")
_SHA = r"^[a-f0-9]{64}$"


class LadderError(ServimgError):
    """A ladder definition or probe set is malformed, or does not match its pin."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


# ------------------------------------------------------------------------------------------- the ladder


class ImagePin(_Frozen):
    """The image the ladder is about: a ref and its expected digest (manifest or config)."""

    ref: str = Field(min_length=1)
    digest: str

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        try:
            Digest.parse(value)
        except ServimgError as exc:
            raise ValueError(exc.message) from None
        return value


class ProbeRef(_Frozen):
    path: str = Field(min_length=1)
    sha256: Annotated[str, Field(pattern=_SHA)]


class ModelSpec(_Frozen):
    served_name: str = Field(min_length=1)
    # `tiny-copy`: when no host directory is given for the mount, servimg generates its tiny copy model
    # inside the image under test (servimg.ladder.tinymodel) and mounts that.
    generate: Literal["tiny-copy"] | None = None


class Mount(_Frozen):
    source: str = Field(min_length=1)  # a host path; `${var}` is replaced by a run variable
    target: str = Field(pattern=r"^/")
    read_only: bool = True


class ServerSpec(_Frozen):
    """How an arm's server starts inside the image under test (or as a local command)."""

    command: tuple[str, ...] = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    port: int = Field(default=8000, ge=1, le=65535)
    shm_size: str = "1g"
    health_path: str = "/health"
    startup_timeout_s: float = Field(default=900, gt=0)
    request_timeout_s: float = Field(default=300, gt=0)
    mounts: tuple[Mount, ...] = ()


class CacheSpec(_Frozen):
    """A cache directory the server keeps (vLLM's compile cache, an LMCache L2 disk tier …)."""

    target: str = Field(pattern=r"^/")
    env: dict[str, str] = {}  # set when the cache is mounted, e.g. LMCACHE_LOCAL_DISK: file:///cache/l2


class Gate(_Frozen):
    """An exercise gate on the arm's metric delta (after − before). Names: adapter names or raw."""

    metric: str = Field(min_length=1)
    op: Literal[">", ">=", "==", "<", "<="] = ">"
    value: float = 0


class ArmSpec(_Frozen):
    id: Annotated[str, Field(pattern=_ID)]
    role: Literal["control", "noise_floor", "cold", "warm", "restart"]
    server: str = Field(default="fresh", pattern=r"^(fresh|reuse:[a-z0-9][a-z0-9._-]{0,63})$")
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    caches: dict[str, str] = {}  # cache name → wipe | retain-from:<arm>
    pre_steps: tuple[Literal["reset_prefix_cache"], ...] = ()
    exercise: tuple[Gate, ...] = ()
    # Modules (dotted names) this arm's configuration reaches: a cached arm whose engine processes never
    # loaded one the image overlays is NOT_EXERCISED (modules it does not overlay leave no record and are
    # not expected). None: every overlay module in the image's witness spec.
    witness_modules: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")], ...] | None = None

    @property
    def reuses(self) -> str | None:
        return self.server.removeprefix("reuse:") if self.server.startswith("reuse:") else None


class Detectors(_Frozen):
    """Text detectors for corrupted output (each None = off)."""

    replacement_char_max: int | None = Field(default=0, ge=0)  # U+FFFD count
    out_of_script_max_fraction: float | None = Field(default=0.2, ge=0, le=1)
    allowed_scripts: tuple[str, ...] = ("LATIN", "DIGIT", "COMMON")
    repeated_block_min_chars: int = Field(default=8, ge=2)
    repeated_block_max_repeats: int | None = Field(default=4, ge=1)  # consecutive repeats of a block
    ngram_n: int = Field(default=4, ge=1)
    ngram_max_fraction: float | None = Field(default=0.5, ge=0, le=1)  # repeated token n-grams / all


class Thresholds(_Frozen):
    """Pre-registered limits. Flips are judged on correctness (detectors + the probe's expectation):
    forward = the control was right and the arm is wrong, reverse = the other way."""

    max_corrupted: int | None = Field(default=0, ge=0)
    flip_margin: int = Field(default=0, ge=0)
    max_divergent_over_noise: int | None = Field(default=0, ge=0)
    max_logprob_delta_over_noise: float | None = Field(default=0.05, ge=0)
    detectors: Detectors = Detectors()


class Sampling(_Frozen):
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = Field(default=8, ge=1, le=4096)
    logprobs: int = Field(default=1, ge=1, le=20)

    @model_validator(mode="after")
    def _greedy(self) -> Sampling:
        if self.temperature != 0 or self.top_p != 1:
            raise ValueError("the ladder compares greedy outputs: temperature must be 0 and top_p 1")
        return self


class LadderDefinition(_Frozen):
    ladder_version: Literal[1] = 1
    name: Annotated[str, Field(pattern=_ID)]
    description: str = ""
    engine: Literal["vllm"] = "vllm"
    image: ImagePin | None = None
    probes: ProbeRef
    model: ModelSpec
    server: ServerSpec
    caches: dict[Annotated[str, Field(pattern=_ID)], CacheSpec] = {}
    vars: dict[Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]*$")], str] = {}
    cache_block_tokens: int = Field(default=16, ge=1)
    # frozen: prompts are sent as their token ids; server: as text, tokenized by the server (real
    # checkpoints bring their own tokenizer), and the ids every arm saw are recorded in the receipt.
    probe_tokens: Literal["frozen", "server"] = "frozen"
    sampling: Sampling
    thresholds: Thresholds
    arms: tuple[ArmSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _cross_checks(self) -> LadderDefinition:
        problems = arm_problems(self.arms, set(self.caches)) + var_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- derived ------------------------------------------------------------------------------------
    def canonical_bytes(self) -> bytes:
        return canonical.dumps(self.model_dump(mode="json"))

    @property
    def thresholds_sha256(self) -> str:
        return sha256_hex(canonical.dumps(self.thresholds.model_dump(mode="json")))

    def arm(self, arm_id: str) -> ArmSpec:
        for arm in self.arms:
            if arm.id == arm_id:
                return arm
        raise LadderError(f"ladder {self.name} has no arm {arm_id!r}")

    def server_arm(self, arm: ArmSpec) -> ArmSpec:
        """The arm whose server `arm` runs on (itself when fresh; reuse chains followed)."""
        while arm.reuses is not None:
            arm = self.arm(arm.reuses)
        return arm

    @property
    def control(self) -> ArmSpec:
        return next(a for a in self.arms if a.role == "control")

    @property
    def noise_floor(self) -> ArmSpec | None:
        return next((a for a in self.arms if a.role == "noise_floor"), None)

    @classmethod
    def parse(cls, text: str | bytes, *, origin: str = "<ladder>") -> LadderDefinition:
        data = _yaml(text, origin)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = [describe_problem(err) for err in exc.errors()]
            if not any(p.startswith("<root>") for p in problems):
                problems += _partial_arm_problems(data)  # pydantic skips cross-checks after field errors
            raise LadderError(
                f"{origin}: {len(problems)} problem(s) in the ladder definition",
                problems=problems,
                hint="fix every listed field; see verify/ladders/cpu-smoke.yaml for a complete example",
            ) from None


def _partial_arm_problems(data: Mapping[str, Any]) -> list[str]:
    """The arm cross-checks over whatever arms validate on their own (to report every problem at once)."""
    arms = []
    for raw in data.get("arms") or []:
        with contextlib.suppress(ValidationError):
            arms.append(ArmSpec.model_validate(raw))
    caches = data.get("caches")
    problems = arm_problems(arms, set(caches) if isinstance(caches, dict) else set()) if arms else []
    raw_server = data.get("server")
    server: Mapping[str, Any] = raw_server if isinstance(raw_server, dict) else {}
    texts: list[Any] = [*(server.get("command") or []), *(server.get("args") or [])]
    texts += list((server.get("env") or {}).values()) + [m.get("source") for m in server.get("mounts") or []]
    for arm in arms:
        texts += [*arm.args, *arm.env.values()]
    raw_vars = data.get("vars")
    declared = set(raw_vars) if isinstance(raw_vars, dict) else set()
    return problems + _undeclared((t for t in texts if isinstance(t, str)), declared)


def arm_problems(arms: Sequence[ArmSpec], cache_names: set[str]) -> list[str]:
    """Cross-field rules: one control first; reuse/retain-from name EARLIER arms; gates on cached arms."""
    problems: list[str] = []
    ids = [a.id for a in arms]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"arm id {dup!r} is declared more than once")
    roles = [a.role for a in arms]
    if roles.count("control") != 1:
        problems.append("exactly one arm must have role control (the reference every arm is compared with)")
    elif arms[0].role != "control":
        problems.append("the control arm must come first")
    if roles.count("noise_floor") > 1:
        problems.append("at most one arm may have role noise_floor")
    seen: dict[str, ArmSpec] = {}
    for i, arm in enumerate(arms):
        where = f"arms[{i}] ({arm.id})"
        if arm.reuses is not None:
            if arm.reuses not in seen:
                problems.append(f"{where}: server reuse:{arm.reuses} must name an earlier arm")
            if arm.args or arm.env or arm.caches:
                problems.append(f"{where}: an arm that reuses a server cannot change its args, env or caches")
            if arm.role in ("control", "noise_floor", "restart"):
                problems.append(f"{where}: a {arm.role} arm needs a fresh server")
        for cache, mode in arm.caches.items():
            if cache not in cache_names:
                problems.append(f"{where}: cache {cache!r} is not declared under `caches`")
            if mode == "wipe":
                continue
            source = mode.removeprefix("retain-from:")
            if not mode.startswith("retain-from:"):
                problems.append(f"{where}: cache {cache!r}: use wipe or retain-from:<arm>")
            elif source not in seen or cache not in seen[source].caches:
                problems.append(
                    f"{where}: cache {cache!r}: retain-from:{source} must name an earlier arm using it"
                )
        if arm.role in CACHED_ROLES and not arm.exercise:
            problems.append(
                f"{where}: a {arm.role} arm needs an exercise gate (NOT_EXERCISED is never PASS), "
                "e.g. exercise: [{metric: prefix_cache_hits, op: '>', value: 0}]"
            )
        seen[arm.id] = arm
    return problems


def var_problems(ladder: LadderDefinition) -> list[str]:
    texts = [*ladder.server.command, *ladder.server.args, *ladder.server.env.values()]
    texts += [m.source for m in ladder.server.mounts]
    for arm in ladder.arms:
        texts += [*arm.args, *arm.env.values()]
    return _undeclared(texts, set(ladder.vars))


def _undeclared(texts: Iterable[str], declared: set[str]) -> list[str]:
    used: set[str] = set()
    for text in texts:
        used.update(_VAR.findall(text))
    return [f"${{{name}}} is used but not declared under `vars`" for name in sorted(used - declared)]


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace `${name}` by its run value; a missing value is an error (never an empty string)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise LadderError(f"no value for ${{{name}}}", hint=f"pass --var {name}=VALUE")
        return values[name]

    return _VAR.sub(one, text)


# ------------------------------------------------------------------------------------------ probe sets


class Expect(_Frozen):
    """What a correct answer starts with: token ids (compared exactly), else text (stripped prefix)."""

    token_ids: tuple[int, ...] = ()
    text: str = ""

    @model_validator(mode="after")
    def _one(self) -> Expect:
        if not self.token_ids and not self.text.strip():
            raise ValueError("give the expected token_ids or text")
        return self


class Prompt(_Frozen):
    id: Annotated[str, Field(pattern=_ID)]
    token_ids: tuple[
        Annotated[int, Field(ge=0)], ...
    ] = ()  # required when the ladder's probe_tokens is frozen
    text: str = Field(min_length=1)
    expect: Expect | None = None


class Family(_Frozen):
    """Prompts sharing a prefix: the first warms the cache, the later ones re-use it across a block edge."""

    id: Annotated[str, Field(pattern=_ID)]
    description: str = ""
    prompts: tuple[Prompt, ...] = Field(min_length=1)


class ProbeSet(_Frozen):
    probe_set_version: Literal[1] = 1
    name: Annotated[str, Field(pattern=_ID)]
    description: str = ""
    tokenizer: str = ""  # what the token ids are for (e.g. the tiny model's recipe key)
    families: tuple[Family, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> ProbeSet:
        ids = [p.id for f in self.families for p in f.prompts] + [f.id for f in self.families]
        dups = sorted({i for i in ids if ids.count(i) > 1})
        if dups:
            raise ValueError(f"ids must be unique across families and prompts: {', '.join(dups)}")
        return self

    @property
    def prompts(self) -> tuple[tuple[Family, Prompt], ...]:
        return tuple((f, p) for f in self.families for p in f.prompts)

    @classmethod
    def parse(cls, data: bytes, *, origin: str = "<probes>") -> ProbeSet:
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            raise LadderError(f"{origin}: not valid JSON", hint="regenerate the probe set") from None
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            problems = [describe_problem(err) for err in exc.errors()]
            raise LadderError(
                f"{origin}: {len(problems)} problem(s) in the probe set", problems=problems
            ) from None


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
    for family, prompt in probes.prompts:
        if frozen and not prompt.token_ids:
            problems.append(f"{family.id}/{prompt.id}: no token_ids (the ladder's probe_tokens is frozen)")
        if prompt.expect is not None and len(prompt.expect.token_ids) > ladder.sampling.max_tokens:
            problems.append(
                f"{family.id}/{prompt.id}: expects {len(prompt.expect.token_ids)} tokens, "
                f"max_tokens is {ladder.sampling.max_tokens}"
            )
    return problems


# ------------------------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class LoadedLadder:
    """A ladder with its probe set, both verified, and the exact bytes they were read from."""

    definition: LadderDefinition
    probes: ProbeSet
    ladder_path: Path
    probes_path: Path
    ladder_bytes: bytes
    probes_bytes: bytes

    @property
    def ladder_sha256(self) -> str:
        return sha256_hex(self.ladder_bytes)

    @property
    def probes_sha256(self) -> str:
        return sha256_hex(self.probes_bytes)


def load(path: Path, *, root: Path | None = None) -> LoadedLadder:
    """Read and validate a ladder and its probe set; the probe path is relative to `root` (default: the
    repository holding `verify/ladders/`), else found beside the ladder (a bundled copy in an image)."""
    ladder_bytes = _read(path, "ladder definition")
    ladder = LadderDefinition.parse(ladder_bytes, origin=str(path))
    probes_path = resolve_probes_path(path, ladder.probes.path, root)
    probes_bytes = _read(probes_path, "probe set")
    actual = sha256_hex(probes_bytes)
    if actual != ladder.probes.sha256:
        raise LadderError(
            f"{probes_path} has sha256 {actual}, the ladder pins {ladder.probes.sha256}",
            hint="the probe set is frozen: restore it, or pin the new sha256 deliberately (a new ladder)",
        )
    probes = ProbeSet.parse(probes_bytes, origin=str(probes_path))
    problems = probe_problems(ladder, probes)
    if problems:
        raise LadderError(f"{probes_path}: the probe set cannot exercise this ladder", problems=problems)
    return LoadedLadder(ladder, probes, path, probes_path, ladder_bytes, probes_bytes)


def resolve_probes_path(ladder_path: Path, probes: str, root: Path | None) -> Path:
    if root is None:
        parent = ladder_path.resolve().parent
        root = (
            parent.parent.parent if (parent.name == "ladders" and parent.parent.name == "verify") else parent
        )
    candidate = root / probes
    if candidate.is_file():
        return candidate
    beside = ladder_path.resolve().parent / Path(probes).name
    return beside if beside.is_file() else candidate


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise LadderError(f"cannot read {what} {path}: {exc.strerror}") from None


def _yaml(text: str | bytes, origin: str) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise LadderError(f"{origin}: not valid YAML: {exc}", hint="fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise LadderError(f"{origin}: the top level must be a mapping")
    return data
