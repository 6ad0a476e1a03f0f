"""The vLLM server's HTTP API as the ladder uses it (OpenAI-compatible completions with token ids and
logprobs, /tokenize, /metrics, /version, /v1/models, the dev-mode /reset_prefix_cache). One request at a
time; every answer parsed into the ladder's own types (`ladder.definition.Output`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import requests

from servimg.core import jsonview as jv
from servimg.core.errors import LadderRunError
from servimg.ladder.definition import LadderDefinition
from servimg.ladder.evaluation import Output
from servimg.ladder.probeset import Prompt


def metrics_text(url: str) -> str:
    try:
        response = requests.get(url + "/metrics", timeout=10)
        return response.text if response.status_code == 200 else ""
    except requests.RequestException:
        return ""


def complete(url: str, model: str, prompt: Prompt, ladder: LadderDefinition, timeout_s: float) -> Output:
    s = ladder.sampling
    frozen = ladder.probe_tokens == "frozen"
    body = {
        "model": model,
        "prompt": list(prompt.token_ids) if frozen else prompt.text,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "logprobs": s.logprobs,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    response = requests.post(url + "/v1/completions", json=body, timeout=timeout_s)
    if response.status_code != 200:
        raise LadderRunError(f"HTTP {response.status_code}: {response.text[:300]}")
    return parse_completion(response.json())


def parse_completion(doc: Mapping[str, object]) -> Output:
    choice = jv.obj((jv.seq(doc.get("choices") or [{}], "choices") or [{}])[0], "choices[0]")
    logprobs = jv.obj(choice.get("logprobs") or {}, "choices[0].logprobs")
    raw_ids = choice.get("token_ids")
    if raw_ids is None:  # servers without return_token_ids: tokens as "token_id:N"
        token_ids = [int(str(t).rpartition(":")[2]) for t in jv.seq(logprobs.get("tokens") or [], "tokens")]
    else:
        token_ids = [jv.integer(t, "token_ids[]") for t in jv.seq(raw_ids, "token_ids")]
    values = [
        jv.number(v, "token_logprobs[]") if v is not None else float("nan")
        for v in jv.seq(logprobs.get("token_logprobs") or [], "token_logprobs")
    ]
    prompt_ids = tuple(
        jv.integer(t, "prompt_token_ids[]") for t in jv.seq(choice.get("prompt_token_ids") or ())
    )
    return Output(
        str(choice.get("text") or ""),
        tuple(token_ids),
        tuple(values),
        jv.optional_text(choice.get("finish_reason"), "finish_reason"),
        prompt_ids,
    )


def tokenization_check(url: str, model: str, prompts: Sequence[Prompt]) -> dict[str, object]:
    """Does the server's tokenizer turn each prompt's text into its token ids? (the ids are what is sent)"""
    mismatched, errors = [], []
    for prompt in prompts:
        try:
            r = requests.post(
                url + "/tokenize",
                json={"model": model, "prompt": prompt.text, "add_special_tokens": False},
                timeout=30,
            )
            if r.status_code != 200:
                errors.append(f"{prompt.id}: HTTP {r.status_code}")
            elif tuple(r.json().get("tokens") or ()) != prompt.token_ids:
                mismatched.append(prompt.id)
        except requests.RequestException as exc:
            errors.append(f"{prompt.id}: {exc}")
    return {"checked": len(prompts), "mismatched": mismatched, "errors": errors[:5]}


def pre_step(url: str, step: str) -> dict[str, object]:
    if step == "reset_prefix_cache":
        r = requests.post(url + "/reset_prefix_cache", timeout=60)
        if r.status_code != 200:
            raise LadderRunError(
                f"reset_prefix_cache: HTTP {r.status_code}",
                hint="vLLM serves it only with VLLM_SERVER_DEV_MODE=1 in the server env",
            )
        return {"step": step, "status": r.status_code}
    raise LadderRunError(f"unknown pre-step {step}")


def server_info(url: str) -> dict[str, object]:
    info: dict[str, object] = {}
    with contextlib.suppress(requests.RequestException, ValueError):
        info["version"] = requests.get(url + "/version", timeout=10).json().get("version")
    with contextlib.suppress(requests.RequestException, ValueError):
        info["models"] = [
            m.get("id") for m in requests.get(url + "/v1/models", timeout=10).json().get("data", [])
        ]
    return info
