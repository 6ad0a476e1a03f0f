"""The tiny copy model the CPU ladder serves: generated locally, inside the image under test, cached by key.

No model hub is reachable, so the model is made here (`_tinymodel_gen.py`, run by the image's own python
with torch/transformers/tokenizers): a 2-layer Llama (head_dim 64, hidden 256) whose weights implement an
induction head, and a WordLevel tokenizer trained with `tokenizers`. Greedy decoding copies from the
context, so a stale KV block shows as a WRONG ANSWER, not only as a logprob delta (docs/design.md, "What runs
where"). Deterministic: fixed seed, no training loop; the cache key covers the recipe, the generator's
source and the image it ran in (transformers writes the config). Tokenisation is a pure function of the
recipe (`encode`), so probe sets are generated on the host (scripts/make-cpu-probes.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servimg.backends import engine
from servimg.backends.engine import ContainerSpec, Mount
from servimg.core import canonical
from servimg.core.digest import sha256_hex
from servimg.core.errors import BackendError, ModelError
from servimg.core.progress import Log
from servimg.inimage import tinymodel_gen as gen
from servimg.oci.store import BlobStore

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

    def cache_key(self, image_config_digest: str) -> str:
        doc = {
            "format": TINY_FORMAT,
            "recipe": self.as_json(),
            "generator": sha256_hex(GENERATOR.read_bytes()),
            "image": image_config_digest,
        }
        return sha256_hex(canonical.dumps(doc))


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
    recipe: TinyModelRecipe,
    image: str,
    store: BlobStore,
    log: Log,
    *,
    timeout_s: float = 900,
) -> Path:
    """The model directory for `recipe` generated in `image` (engine ref), from the cache when present."""
    try:
        config_digest = str(engine.inspect(image)["Id"])
    except BackendError as exc:
        raise ModelError(exc.message, hint=exc.hint) from exc
    key = recipe.cache_key(config_digest)
    final = store.layout.models / f"tiny-copy-{key[:16]}"
    if (final / "servimg-model.json").is_file():
        log(f"tiny model: cached at {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tiny-", dir=final.parent))
    out, scripts = work / "out", work / "gen"
    out.mkdir()
    scripts.mkdir()
    shutil.copyfile(GENERATOR, scripts / "gen.py")
    log(f"tiny model: generating in {image} (key {key[:12]})")
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
        for path in out.iterdir():
            path.chmod(0o644)  # readable by a server that does not run as root
        out.chmod(0o755)
        try:
            out.rename(final)
        except OSError:
            if not (final / "servimg-model.json").is_file():  # else: a concurrent run made it first
                raise
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
