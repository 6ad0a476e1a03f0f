"""Ladder definitions (`verify/ladders/<name>.yaml`) and probe sets (`verify/probes/<name>.json`).

A ladder is written down BEFORE any arm runs (docs/design.md, "ladder"): arms that change one variable at a
time, a frozen probe set pinned by sha256, thresholds, and exercise gates. This module only parses and
validates; every problem is reported at once with its YAML path, like image definitions. Pure apart from
`load_*`.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import LadderError, ServimgError
from servimg.core.strictyaml import StrictLoader
from servimg.ladder import readers as r

CACHED_ROLES = ("cold", "warm", "restart")
_VAR = re.compile(r"\$\{([a-z_][a-z0-9_]*)\}")
_SHA = r"[a-f0-9]{64}"
_ABSOLUTE_PATH = r.text(pattern="/.*", meaning="an absolute path")
_ROLES = ("control", "noise_floor", "cold", "warm", "restart")
_ENV = r.mapping(r.STRING, r.STRING)
_ARGS = r.items(r.STRING)


# ------------------------------------------------------------------------------------------- the ladder


@dataclass(frozen=True, kw_only=True)
class ImagePin:
    """The image the ladder is about: a ref and its expected digest (manifest or config)."""

    ref: str
    digest: Digest

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> ImagePin:
        f = r.shape(value, path, problems, "ref, digest")
        return f.made(cls(ref=f.take("ref", r.text(min_length=1)), digest=f.take("digest", _digest)))


def _digest(value: object, path: str, problems: list[str]) -> Digest:
    try:
        return Digest.parse(r.string(value))
    except ServimgError as exc:
        raise r.Invalid(exc.message) from None


@dataclass(frozen=True, kw_only=True)
class ProbeRef:
    """The probe set the ladder is written for: its path (from the repository root, else beside the
    ladder) and the sha256 that freezes it."""

    path: str
    sha256: str

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> ProbeRef:
        f = r.shape(value, path, problems, "path, sha256")
        sha256 = r.text(pattern=_SHA, meaning="a sha256: 64 lowercase hex digits")
        return f.made(cls(path=f.take("path", r.text(min_length=1)), sha256=f.take("sha256", sha256)))


@dataclass(frozen=True, kw_only=True)
class InstrumentRef:
    """A Python module that belongs to the ladder, not to the image under test (e.g. the connector
    instrument, verify/instruments/servimg_hybrid_connector.py): pinned by sha256 like the probe set,
    mounted read-only into every fresh server at `INSTRUMENT_TARGET` on PYTHONPATH, with a writable
    directory for what it reports (`$SERVIMG_INSTRUMENT_DIR`, read beside the server's /metrics)."""

    path: str
    sha256: str

    @property
    def module(self) -> str:
        return Path(self.path).stem

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> InstrumentRef:
        f = r.shape(value, path, problems, "path, sha256")
        sha256 = r.text(pattern=_SHA, meaning="a sha256: 64 lowercase hex digits")
        module = r.text(pattern=r"([^/]+/)*[A-Za-z_][A-Za-z0-9_]*\.py", meaning="a path to a Python module")
        return f.made(cls(path=f.take("path", module), sha256=f.take("sha256", sha256)))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    served_name: str
    # When no host directory is given for the `model_dir` mount, servimg generates this inside the image
    # under test (servimg.ladder.tinymodel) and mounts that: `tiny-copy`, its tiny copy model, or
    # `tiny-hybrids`, a directory holding a GDN hybrid (gdn/) and a Mamba2 hybrid (mamba2/), or
    # `seed-hybrid`, the seed incident's slow-decay GDN hybrid (gdn/).
    generate: Literal["tiny-copy", "tiny-hybrids", "seed-hybrid"] | None = None

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> ModelSpec:
        f = r.shape(value, path, problems, "served_name, generate")
        served_name = f.take("served_name", r.text(min_length=1))
        generate = f.take("generate", r.optional(r.choice("tiny-copy", "tiny-hybrids", "seed-hybrid")), None)
        return f.made(cls(served_name=served_name, generate=generate))  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Mount:
    source: str  # a host path; `${var}` is replaced by a run variable
    target: str
    read_only: bool = True

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Mount:
        f = r.shape(value, path, problems, "source, target, read_only")
        source = f.take("source", r.text(min_length=1))
        target = f.take("target", _ABSOLUTE_PATH)
        return f.made(cls(source=source, target=target, read_only=f.take("read_only", r.boolean, True)))


@dataclass(frozen=True, kw_only=True)
class ServerSpec:
    """How an arm's server starts inside the image under test (or as a local command)."""

    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    port: int = 8000
    shm_size: str = "1g"
    health_path: str = "/health"
    startup_timeout_s: float = 900
    request_timeout_s: float = 300
    mounts: tuple[Mount, ...] = ()

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> ServerSpec:
        f = r.shape(value, path, problems, "command, args, env, port, …")
        return f.made(
            cls(
                command=f.take("command", r.items(r.STRING, min_length=1)),
                args=f.take("args", _ARGS, ()),
                env=f.take("env", _ENV, {}),
                port=f.take("port", r.integer(ge=1, le=65535), 8000),
                shm_size=f.take("shm_size", r.STRING, "1g"),
                health_path=f.take("health_path", r.STRING, "/health"),
                startup_timeout_s=f.take("startup_timeout_s", r.floating(gt=0), 900),
                request_timeout_s=f.take("request_timeout_s", r.floating(gt=0), 300),
                mounts=f.take("mounts", r.items(Mount.read), ()),
            )
        )


@dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """A cache directory the server keeps (vLLM's compile cache, an LMCache L2 disk tier …)."""

    target: str
    env: dict[str, str] = field(
        default_factory=dict
    )  # set when mounted, e.g. LMCACHE_LOCAL_DISK: file:///cache/l2

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> CacheSpec:
        f = r.shape(value, path, problems, "target, env")
        return f.made(cls(target=f.take("target", _ABSOLUTE_PATH), env=f.take("env", _ENV, {})))


@dataclass(frozen=True, kw_only=True)
class Gate:
    """An exercise gate on the arm's metric delta (after − before). Names: adapter names or raw."""

    metric: str
    op: Literal[">", ">=", "==", "<", "<="] = ">"
    value: float = 0

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Gate:
        f = r.shape(value, path, problems, "metric, op, value")
        return f.made(
            cls(
                metric=f.take("metric", r.text(min_length=1)),
                op=f.take("op", r.choice(">", ">=", "==", "<", "<="), ">"),  # type: ignore[arg-type]
                value=f.take("value", r.floating(), 0),
            )
        )


@dataclass(frozen=True, kw_only=True)
class ArmSpec:
    id: str
    role: Literal["control", "noise_floor", "cold", "warm", "restart"]
    server: str = "fresh"
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    caches: dict[str, str] = field(default_factory=dict)  # cache name → wipe | retain-from:<arm>
    pre_steps: tuple[Literal["reset_prefix_cache"], ...] = ()
    exercise: tuple[Gate, ...] = ()
    # Modules (dotted names) this arm's configuration reaches: a cached arm whose engine processes never
    # loaded one the image overlays is NOT_EXERCISED (modules it does not overlay leave no record and are
    # not expected). None: every overlay module in the image's witness spec.
    witness_modules: tuple[str, ...] | None = None
    # The model family the arm serves (a ladder over several models, e.g. a GDN and a Mamba2 hybrid):
    # each family has its own control and noise floor, and an arm is compared with its family's only.
    # Left out of the canonical form when unset, so a ladder of one model keeps its bytes.
    model_family: str = field(default="", metadata={"omit_default": True})
    # The probe ids this arm sends, in this order (one may repeat): e.g. a long prompt, then a short one
    # hitting part of its stored prefix, then the long one again. Unset: every prompt in probe-set order.
    prompts: tuple[str, ...] = field(default=(), metadata={"omit_default": True})

    @property
    def reuses(self) -> str | None:
        return self.server.removeprefix("reuse:") if self.server.startswith("reuse:") else None

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> ArmSpec:
        f = r.shape(value, path, problems, "id, role, server, args, …")
        modules = r.items(r.text(pattern=r"[A-Za-z_][A-Za-z0-9_.]*", meaning="a dotted module name"))
        return f.made(
            cls(
                id=f.take("id", r.IDENT),
                role=f.take("role", r.choice(*_ROLES)),  # type: ignore[arg-type]
                server=f.take(
                    "server",
                    r.text(pattern=rf"fresh|reuse:{r.ID_PATTERN}", meaning="fresh or reuse:<an earlier arm>"),
                    "fresh",
                ),
                args=f.take("args", _ARGS, ()),
                env=f.take("env", _ENV, {}),
                caches=f.take("caches", _ENV, {}),
                pre_steps=f.take("pre_steps", r.items(r.choice("reset_prefix_cache")), ()),  # type: ignore[arg-type]
                exercise=f.take("exercise", r.items(Gate.read), ()),
                witness_modules=f.take("witness_modules", r.optional(modules), None),
                model_family=f.take("model_family", r.IDENT, ""),
                prompts=f.take("prompts", r.items(r.IDENT, min_length=1), ()),
            )
        )


@dataclass(frozen=True, kw_only=True)
class Detectors:
    """Text detectors for corrupted output (each None = off)."""

    replacement_char_max: int | None = 0  # U+FFFD count
    out_of_script_max_fraction: float | None = 0.2
    allowed_scripts: tuple[str, ...] = ("LATIN", "DIGIT", "COMMON")
    repeated_block_min_chars: int = 8
    repeated_block_max_repeats: int | None = 4  # consecutive repeats of a block
    ngram_n: int = 4
    ngram_max_fraction: float | None = 0.5  # repeated token n-grams / all

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Detectors:
        f = r.shape(value, path, problems, "replacement_char_max, ngram_n, …")
        fraction = r.optional(r.floating(ge=0, le=1))
        return f.made(
            cls(
                replacement_char_max=f.take("replacement_char_max", r.optional(r.integer(ge=0)), 0),
                out_of_script_max_fraction=f.take("out_of_script_max_fraction", fraction, 0.2),
                allowed_scripts=f.take("allowed_scripts", _ARGS, ("LATIN", "DIGIT", "COMMON")),
                repeated_block_min_chars=f.take("repeated_block_min_chars", r.integer(ge=2), 8),
                repeated_block_max_repeats=f.take(
                    "repeated_block_max_repeats", r.optional(r.integer(ge=1)), 4
                ),
                ngram_n=f.take("ngram_n", r.integer(ge=1), 4),
                ngram_max_fraction=f.take("ngram_max_fraction", fraction, 0.5),
            )
        )


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """Pre-registered limits. Flips are judged on correctness (detectors + the probe's expectation):
    forward = the control was right and the arm is wrong, reverse = the other way."""

    max_corrupted: int | None = 0
    flip_margin: int = 0
    max_divergent_over_noise: int | None = 0
    max_logprob_delta_over_noise: float | None = 0.05
    detectors: Detectors = field(default_factory=Detectors)

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Thresholds:
        f = r.shape(value, path, problems, "max_corrupted, flip_margin, …")
        count = r.optional(r.integer(ge=0))
        return f.made(
            cls(
                max_corrupted=f.take("max_corrupted", count, 0),
                flip_margin=f.take("flip_margin", r.integer(ge=0), 0),
                max_divergent_over_noise=f.take("max_divergent_over_noise", count, 0),
                max_logprob_delta_over_noise=f.take(
                    "max_logprob_delta_over_noise", r.optional(r.floating(ge=0)), 0.05
                ),
                detectors=f.take("detectors", Detectors.read, Detectors()),
            )
        )


@dataclass(frozen=True, kw_only=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 8
    logprobs: int = 1

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> Sampling:
        f = r.shape(value, path, problems, "temperature, top_p, seed, max_tokens, logprobs")
        sampling = cls(
            temperature=f.take("temperature", r.floating(), 0.0),
            top_p=f.take("top_p", r.floating(), 1.0),
            seed=f.take("seed", r.integer(), 0),
            max_tokens=f.take("max_tokens", r.integer(ge=1, le=4096), 8),
            logprobs=f.take("logprobs", r.integer(ge=1, le=20), 1),
        )
        greedy = sampling.temperature == 0 and sampling.top_p == 1
        if sampling.temperature is not None and sampling.top_p is not None and not greedy:
            problems.append(
                r.problem(path, "the ladder compares greedy outputs: temperature must be 0 and top_p 1")
            )
        f.done()
        return sampling


@dataclass(frozen=True, kw_only=True)
class LadderDefinition:
    ladder_version: Literal[1] = 1
    name: str
    description: str = ""
    engine: Literal["vllm"] = "vllm"
    image: ImagePin | None = None
    probes: ProbeRef
    # Left out of the canonical form when unset, so a ladder without one keeps its bytes.
    instrument: InstrumentRef | None = field(default=None, metadata={"omit_default": True})
    model: ModelSpec
    server: ServerSpec
    caches: dict[str, CacheSpec] = field(default_factory=dict)
    vars: dict[str, str] = field(default_factory=dict)
    cache_block_tokens: int = 16
    # CPU flags (/proc/cpuinfo names) a host must have to serve this ladder's model at all, e.g.
    # avx512_bf16 for vLLM's bf16-only CPU GDN kernels; checked before the first arm. Left out of the
    # canonical form when empty.
    requires_cpu_flags: tuple[str, ...] = field(default=(), metadata={"omit_default": True})
    # CPU state every Python process of a fresh server asks Linux for before anything else runs (a run
    # variable: servimg/inimage/cpu_permissions.py as the server's sitecustomize; the image is
    # unchanged). `amx`: AMX tile data, without which an AMX host's oneDNN code dies with SIGILL.
    cpu_permissions: tuple[Literal["amx"], ...] = field(default=(), metadata={"omit_default": True})
    # frozen: prompts are sent as their token ids; server: as text, tokenized by the server (real
    # checkpoints bring their own tokenizer), and the ids every arm saw are recorded in the receipt.
    probe_tokens: Literal["frozen", "server"] = "frozen"
    sampling: Sampling
    thresholds: Thresholds
    arms: tuple[ArmSpec, ...]

    # -- derived ------------------------------------------------------------------------------------
    def as_json(self) -> dict[str, object]:
        return dict(jv.obj(canonical.plain(self)))

    def canonical_bytes(self) -> bytes:
        return canonical.dumps(self.as_json())

    @property
    def thresholds_sha256(self) -> str:
        return sha256_hex(canonical.dumps(canonical.plain(self.thresholds)))

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
    def model_families(self) -> tuple[str, ...]:
        """The arms' model families in declared order ("" for a ladder of one model)."""
        return tuple(dict.fromkeys(a.model_family for a in self.arms))

    def control(self, model_family: str = "") -> ArmSpec:
        return next(a for a in self.arms if a.role == "control" and a.model_family == model_family)

    def noise_floor(self, model_family: str = "") -> ArmSpec | None:
        return next(
            (a for a in self.arms if a.role == "noise_floor" and a.model_family == model_family), None
        )

    @classmethod
    def parse(cls, text: str | bytes, *, origin: str = "<ladder>") -> LadderDefinition:
        data = _yaml(text, origin)
        problems: list[str] = []
        ladder = r.read(cls.read, data, "", problems)
        if ladder is None:
            raise LadderError(
                f"{origin}: {len(problems)} problem(s) in the ladder definition",
                problems=problems,
                hint="fix every listed field; see verify/ladders/cpu-smoke.yaml for a complete example",
            )
        return ladder

    @classmethod
    def read(cls, value: object, path: str, problems: list[str]) -> LadderDefinition:
        f = r.shape(value, path, problems, "a ladder definition")
        var_name = r.text(pattern=r"[a-z_][a-z0-9_]*", meaning="a variable name")
        ladder = cls(
            ladder_version=f.take("ladder_version", r.version(1), 1),  # type: ignore[arg-type]
            name=f.take("name", r.IDENT),
            description=f.take("description", r.STRING, ""),
            engine=f.take("engine", r.choice("vllm"), "vllm"),  # type: ignore[arg-type]
            image=f.take("image", r.optional(ImagePin.read), None),
            probes=f.take("probes", ProbeRef.read),
            instrument=f.take("instrument", r.optional(InstrumentRef.read), None),
            model=f.take("model", ModelSpec.read),
            server=f.take("server", ServerSpec.read),
            caches=f.take("caches", r.mapping(r.IDENT, CacheSpec.read), {}),
            vars=f.take("vars", r.mapping(var_name, r.STRING), {}),
            cache_block_tokens=f.take("cache_block_tokens", r.integer(ge=1), 16),
            requires_cpu_flags=f.take(
                "requires_cpu_flags", r.items(r.text(pattern=r"[a-z0-9_]+", meaning="a CPU flag")), ()
            ),
            cpu_permissions=f.take("cpu_permissions", r.items(r.choice("amx")), ()),  # type: ignore[arg-type]
            probe_tokens=f.take("probe_tokens", r.choice("frozen", "server"), "frozen"),  # type: ignore[arg-type]
            sampling=f.take("sampling", Sampling.read),
            thresholds=f.take("thresholds", Thresholds.read),
            arms=f.take("arms", r.items(ArmSpec.read, min_length=1)),
        )
        problems += _cross_problems(f)
        f.done()
        return ladder


def _cross_problems(f: r.Fields) -> list[str]:
    """The rules across fields, over every arm that validates on its own (so a problem in one arm
    hides none of the others)."""
    raw_arms = f.raw("arms")
    listed = list(raw_arms) if isinstance(raw_arms, list | tuple | set | frozenset) else []
    arms: list[tuple[int, ArmSpec]] = []
    # (family, role) as written where the arm itself does not validate (role None: unreadable)
    roles: list[tuple[str, str | None]] = []
    for i, raw in enumerate(listed):
        arm = r.read(ArmSpec.read, raw, "", [])
        if arm is not None:
            arms.append((i, arm))
        role = raw.get("role") if isinstance(raw, Mapping) else None
        family = raw.get("model_family", "") if isinstance(raw, Mapping) else ""
        roles.append(
            (arm.model_family, arm.role)
            if arm is not None
            else (str(family), role if role in _ROLES else None)
        )
    raw_caches = f.raw("caches")
    caches = set(r.strings_in(list(raw_caches))) if isinstance(raw_caches, Mapping) else set()
    problems = family_problems(roles) + arm_problems(arms, caches) if listed else []
    server = f.raw("server")
    texts: list[str] = []
    if isinstance(server, Mapping):
        texts += r.strings_in(server.get("command")) + r.strings_in(server.get("args"))
        texts += r.strings_in(server.get("env"))
        mounts = server.get("mounts")
        for mount in mounts if isinstance(mounts, list | tuple) else []:
            texts += r.strings_in([mount.get("source")]) if isinstance(mount, Mapping) else []
    for _, arm in arms:
        texts += [*arm.args, *arm.env.values()]
    raw_vars = f.raw("vars")
    declared = set(r.strings_in(list(raw_vars))) if isinstance(raw_vars, Mapping) else set()
    instrument = r.read(r.optional(InstrumentRef.read), f.raw("instrument"), "", [])
    problems += connector_problems(arms, instrument.module if instrument is not None else None)
    return problems + [r.problem("vars", p) for p in _undeclared(texts, declared)]


def connector_problems(arms: Sequence[tuple[int, ArmSpec]], instrument: str | None) -> list[str]:
    """An arm may attach only the ladder's own instrument as a connector module: one the image under
    test would have to bring is not what the ladder pre-registered (`kv_connector_module_path` in a
    `--kv-transfer-config` JSON argument)."""
    problems = []
    for i, arm in arms:
        for module in _connector_modules(arm.args):
            if module is None:
                problems.append(f"arms[{i}].args ({arm.id}): --kv-transfer-config is not a JSON object")
            elif instrument is None:
                problems.append(
                    f"arms[{i}].args ({arm.id}): kv_connector_module_path {module!r} names a connector "
                    "module, but the ladder declares no `instrument` to mount: declare it "
                    "(instrument: {path: verify/instruments/<module>.py, sha256: …})"
                )
            elif module != instrument:
                problems.append(
                    f"arms[{i}].args ({arm.id}): kv_connector_module_path {module!r} is not the ladder's "
                    f"instrument {instrument!r}: the image under test cannot be asked to load it"
                )
    return problems


def _connector_modules(args: Sequence[str]) -> list[str | None]:
    """The `kv_connector_module_path` of each `--kv-transfer-config` in `args` (None: unreadable)."""
    found: list[str | None] = []
    for flag, value in itertools.pairwise(args):
        if flag != "--kv-transfer-config":
            continue
        try:
            config = json.loads(value)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            found.append(None)
        elif "kv_connector_module_path" in config:
            found.append(str(config["kv_connector_module_path"]))
    return found


def family_problems(roles: Sequence[tuple[str, str | None]]) -> list[str]:
    """`role_problems` for each model family's arms ((family, role) per arm), named by family when the
    ladder has several."""
    families = list(dict.fromkeys(family for family, _ in roles))
    problems = []
    for family in families:
        where = f"arms (model_family {family or '(none)'})" if len(families) > 1 else "arms"
        problems += role_problems([role for f, role in roles if f == family], where)
    return problems


def role_problems(roles: Sequence[str | None], where: str = "arms") -> list[str]:
    """One control, first; at most one noise floor. `roles[i]` is arm i's (None: unreadable, so a rule
    that depends on it is not judged: that arm's own problem is reported); `where` names the arms."""
    problems: list[str] = []
    known = [role for role in roles if role is not None]
    controls = known.count("control")
    if controls > 1 or (controls == 0 and len(known) == len(roles)):
        problems.append(
            f"{where}: exactly one arm must have role control (the reference every arm is compared with)"
        )
    elif controls == 1 and roles[0] not in (None, "control"):
        problems.append(f"{where}: the control arm must come first")
    if known.count("noise_floor") > 1:
        problems.append(f"{where}: at most one arm may have role noise_floor")
    return problems


def arm_problems(arms: Sequence[tuple[int, ArmSpec]], cache_names: set[str]) -> list[str]:
    """Rules across arms, over (index, arm) for every arm that validates: ids unique; reuse and
    retain-from name EARLIER arms; gates on cached arms."""
    problems: list[str] = []
    ids = [a.id for _, a in arms]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"arms: arm id {dup!r} is declared more than once")
    seen: dict[str, ArmSpec] = {}
    for i, arm in arms:
        server, caches = f"arms[{i}].server ({arm.id})", f"arms[{i}].caches ({arm.id})"
        if arm.reuses is not None:
            if arm.reuses not in seen:
                problems.append(f"{server}: reuse:{arm.reuses} must name an earlier arm")
            if arm.args or arm.env or arm.caches:
                problems.append(
                    f"{server}: an arm that reuses a server cannot change its args, env or caches"
                )
            if arm.role in ("control", "noise_floor", "restart"):
                problems.append(f"{server}: a {arm.role} arm needs a fresh server")
        for cache, mode in arm.caches.items():
            if cache not in cache_names:
                problems.append(f"{caches}: cache {cache!r} is not declared under `caches`")
            if mode == "wipe":
                continue
            source = mode.removeprefix("retain-from:")
            if not mode.startswith("retain-from:"):
                problems.append(f"{caches}: cache {cache!r}: use wipe or retain-from:<arm>")
            elif source not in seen or cache not in seen[source].caches:
                problems.append(
                    f"{caches}: cache {cache!r}: retain-from:{source} must name an earlier arm using it"
                )
        if arm.role in CACHED_ROLES and not arm.exercise:
            problems.append(
                f"arms[{i}].exercise ({arm.id}): a {arm.role} arm needs an exercise gate (NOT_EXERCISED is "
                "never PASS), e.g. exercise: [{metric: prefix_cache_hits, op: '>', value: 0}]"
            )
        seen[arm.id] = arm
    return problems


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


def _yaml(text: str | bytes, origin: str) -> dict[str, object]:
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise LadderError(f"{origin}: not valid YAML: {exc}", hint="fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise LadderError(f"{origin}: the top level must be a mapping")
    return data
