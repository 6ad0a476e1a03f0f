"""The tiny models the CPU ladders serve: generated locally, inside the image under test, cached by key.

No model hub is reachable, so the model is made here (`_tinymodel_gen.py`, run by the image's own python
with torch/transformers/tokenizers): a 2-layer Llama (head_dim 64, hidden 256) whose weights implement an
induction head, and a WordLevel tokenizer trained with `tokenizers`. Greedy decoding copies from the
context, so a stale KV block shows as a WRONG ANSWER, not only as a logprob delta (docs/design.md, "What runs
where"). Deterministic: fixed seed, no training loop; the cache key covers the recipe, the generator's
source and the image it ran in (transformers writes the config). Tokenisation is a pure function of the
recipe (`encode`), so probe sets are generated on the host (scripts/make-cpu-probes.py).

The hybrid ladder (verify/ladders/cpu-hybrid.yaml) serves `tiny-hybrids`: one directory holding a
gated-delta-net hybrid (`gdn/`, Qwen3Next) and a Mamba2 hybrid (`mamba2/`, NemotronH), random weights
under a fixed seed and the same trained tokenizer, each self-checked to carry context in its recurrent
state. A wrong recurrent state shows as a token or logprob difference from the control (bit-exact on CPU).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from servimg.backends import engine
from servimg.backends.engine import ContainerSpec, Mount
from servimg.core import canonical
from servimg.core.context import Log
from servimg.core.digest import sha256_hex
from servimg.core.errors import BackendError, ModelError
from servimg.inimage import tinymodel_gen as gen

TINY_FORMAT = 1
GENERATOR = Path(gen.__file__)
SPECIALS: tuple[str, ...] = tuple(gen.SPECIALS)
BOS, EOS, SEP = 1, 2, 3


@dataclass(frozen=True)
class TinyModelRecipe:
    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 256
    code_dim: int = 32
    rope_theta: float = 1e7
    max_position_embeddings: int = 1024
    prev_head_scale: float = 216.0
    copy_head_scale: float = 5.0
    lm_head_scale: float = 1.0
    seed: int = 20260101
    dtype: str = "float32"

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def tokenizer_key(self) -> str:
        """What token ids mean: the vocabulary (a pure function of the recipe) and the special tokens."""
        return sha256_hex(canonical.dumps({"specials": list(SPECIALS), "words": vocabulary(self)}))

    @property
    def name(self) -> str:
        return "tiny-copy"

    def cache_key(self, image_config_digest: str) -> str:
        return _cache_key(self.as_json(), image_config_digest)


def _cache_key(recipe: Mapping[str, object], image_config_digest: str) -> str:
    """Everything the files are a function of: the recipe, the generator's source, the image it ran in."""
    doc = {
        "format": TINY_FORMAT,
        "recipe": dict(recipe),
        "generator": sha256_hex(GENERATOR.read_bytes()),
        "image": image_config_digest,
    }
    return sha256_hex(canonical.dumps(doc))


LayerType = Literal["linear_attention", "full_attention", "mlp"]


_LATER_FIELDS = ("moe_layers", "num_experts", "dt_bias")


@dataclass(frozen=True)
class HybridModelRecipe:
    """A tiny hybrid: `linear_attention` layers are the recurrent ones (gated delta net for
    `gdn-hybrid`, Mamba2 for `mamba2-hybrid`). Same vocabulary as the copy model, so the probes' token
    ids mean the same words; head_dim 64 (the CPU attention kernel refuses 16)."""

    kind: Literal["gdn-hybrid", "mamba2-hybrid"]
    layers: tuple[LayerType, ...]
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    # HF's 0.02 leaves the logits nearly flat; 0.1 makes them depend on the recurrent state visibly.
    initializer_range: float = 0.1
    # The recurrent layers' decay rates A (per head, evenly spaced): a memory of 1/(A·dt) tokens, long
    # enough that a state restored at a block edge still shapes the answer hundreds of tokens later.
    a_min: float = 0.001
    a_max: float = 0.01
    # Self-check: with every attention output cut, changing the first 10 of 300 tokens must move the last
    # position's logits by at least this much (what only the recurrent state carries).
    min_recurrent_dependence: float = 1e-3
    seed: int = 20261204
    # Qwen3Next's MoE: the layers (0-based) that carry `num_experts` experts; () = the last layer only.
    # vLLM refuses a Qwen3Next without a MoE layer.
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 2
    # The recurrent layers' dt bias; None = HF's initialisation. 0 with A in [1e-3, 1e-2] is the seed
    # incident's slow decay (issue 47), so a state missing at a block edge shows in the answer.
    dt_bias: float | None = None

    def as_json(self) -> dict[str, object]:
        # The fields added later are left out at their defaults: the models generated before keep their
        # cache keys (and bytes).
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        doc = {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(self).items()
            if k not in _LATER_FIELDS or v != defaults[k]
        }
        return doc


GDN_HYBRID = HybridModelRecipe(
    "gdn-hybrid", ("linear_attention", "full_attention", "linear_attention", "full_attention")
)
MAMBA2_HYBRID = HybridModelRecipe(
    "mamba2-hybrid", ("linear_attention", "full_attention", "linear_attention", "mlp")
)


@dataclass(frozen=True)
class ModelSet:
    """Several tiny models generated together, each in a subdirectory named by its key."""

    name: str
    members: tuple[tuple[str, HybridModelRecipe], ...]

    def as_json(self) -> dict[str, object]:
        return {"kind": "set", "members": {key: recipe.as_json() for key, recipe in self.members}}

    def cache_key(self, image_config_digest: str) -> str:
        return _cache_key(self.as_json(), image_config_digest)


class Recipe(Protocol):
    @property
    def name(self) -> str: ...

    def as_json(self) -> dict[str, object]: ...

    def cache_key(self, image_config_digest: str) -> str: ...


# The seed incident's model (issue 47): a Qwen3Next of three gated-delta-net layers before one full
# attention layer, hidden 256, 4 experts on layers 2-3, A in [1e-3, 1e-2] and dt bias 0. After one 900-token
# prefill its attention group holds 256-token blocks the recurrent group has no state for: the window
# the seed bug acts in (verify/ladders/cpu-connector.yaml).
SEED_GDN = HybridModelRecipe(
    "gdn-hybrid",
    ("linear_attention", "linear_attention", "linear_attention", "full_attention"),
    hidden_size=256,
    moe_layers=(2, 3),
    num_experts=4,
    dt_bias=0.0,
)
TINY_HYBRIDS = ModelSet("tiny-hybrids", (("gdn", GDN_HYBRID), ("mamba2", MAMBA2_HYBRID)))
SEED_HYBRID = ModelSet("seed-hybrid", (("gdn", SEED_GDN),))
# What a ladder's `model.generate` names (ladder.definition.ModelSpec).
GENERATED: dict[str, Recipe] = {
    "tiny-copy": TinyModelRecipe(),
    "tiny-hybrids": TINY_HYBRIDS,
    "seed-hybrid": SEED_HYBRID,
}


def vocabulary(recipe: TinyModelRecipe) -> list[str]:
    """The words of the tokenizer, in id order after the special tokens."""
    return list(gen.words(recipe.vocab_size - len(SPECIALS)))


def encode(recipe: TinyModelRecipe, text: str) -> list[int]:
    """Token ids of whitespace-separated words/special tokens (what the trained WordLevel tokenizer gives)."""
    ids = {w: i for i, w in enumerate([*SPECIALS, *vocabulary(recipe)])}
    try:
        return [ids[w] for w in text.split()]
    except KeyError as exc:
        raise ModelError(f"{exc.args[0]!r} is not in the tiny model's vocabulary") from None


def decode(recipe: TinyModelRecipe, token_ids: Sequence[int]) -> str:
    words = [*SPECIALS, *vocabulary(recipe)]
    return " ".join(words[i] for i in token_ids)


def ensure_model(
    recipe: Recipe,
    image: str,
    models: Path,
    log: Log,
    *,
    timeout_s: float = 900,
) -> Path:
    """The model directory for `recipe` generated in `image` (engine ref), kept under `models` (the cache's
    models section, `cache.layout`) and taken from there when present."""
    try:
        config_digest = str(engine.inspect(image)["Id"])
    except BackendError as exc:
        raise ModelError(exc.message, hint=exc.hint) from exc
    key = recipe.cache_key(config_digest)
    final = models / f"{recipe.name}-{key[:16]}"
    if (final / "servimg-model.json").is_file():
        log(f"tiny model: cached at {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tiny-", dir=final.parent))
    out, scripts = work / "out", work / "gen"
    out.mkdir()
    scripts.mkdir()
    shutil.copyfile(GENERATOR, scripts / "gen.py")
    log(f"tiny model: generating {recipe.name} in {image} (key {key[:12]})")
    spec = ContainerSpec(
        config_digest,
        ["/opt/venv/bin/python", "/gen/gen.py", json.dumps(recipe.as_json(), sort_keys=True), "/out"],
        env={"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        mounts=(Mount(str(scripts), "/gen", read_only=True), Mount(str(out), "/out")),
        labels={"io.servimg.role": "tiny-model"},
    )
    try:
        try:
            exited = engine.run(spec, timeout=timeout_s)
        except BackendError as exc:
            raise ModelError(f"generating the tiny model: {exc.message}", hint=exc.hint) from exc
        if exited.status != 0:
            raise ModelError(
                f"generating the tiny model failed (exit {exited.status})",
                problems=(exited.stdout + exited.stderr).strip().splitlines()[-15:],
                hint="the image needs torch, transformers, tokenizers and safetensors (the CPU vLLM base)",
            )
        for line in exited.stdout.splitlines():
            if line.startswith("self-check"):
                log(f"tiny model: {line}")
        for path in out.rglob("*"):  # readable by a server that does not run as root
            path.chmod(0o755 if path.is_dir() else 0o644)
        out.chmod(0o755)
        try:
            out.rename(final)
        except OSError:
            if not (final / "servimg-model.json").is_file():  # else: a concurrent run made it first
                raise
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
