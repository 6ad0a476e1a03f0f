# mypy: ignore-errors
"""Runs INSIDE the CPU vLLM image (torch, transformers, tokenizers, safetensors): writes the tiny model.

    python _tinymodel_gen.py '<recipe json>' /out

The model is a 2-layer Llama whose weights are random token codes plus an exact construction of an
induction circuit, so that greedy decoding COPIES: after `... a b ... <sep> a` it emits `b`, then what
followed `b`, and so on. Copying from the context makes KV corruption visible as wrong answers: a block
whose KV is stale no longer holds the key the copy head looks for.

- residual stream (hidden 256): TOK (token code, ±1), CONST (a constant), PREV (previous token's code,
  written by layer 0), OUT (the copied code, written by layer 1);
- layer 0, head 0: a previous-token head. q and k are constant vectors on the CONST channel, placed on the
  16 fastest RoPE pairs so that the score A·Σcos((i-j-1)θ_d) peaks at j = i-1; v copies TOK into PREV;
- layer 1, head 0: the induction head. q = TOK, k = PREV on the 16 slowest RoPE pairs (rope_theta 1e7:
  under 0.17 rad of rotation over 512 positions, so the match is position-invariant); v copies TOK to OUT;
- MLPs are zero; lm_head reads OUT against every token's code.

The tokenizer is a WordLevel model TRAINED here with `tokenizers` on a synthetic corpus in which word i
occurs (V - i) times, so training assigns ids in a known order; the script checks that it did. Every
number comes from the recipe (numpy seed): the same recipe gives the same files. Self-check: copy accuracy
of the HF model on random sequences must be ≥ 0.95, else nothing is written.
"""

import json
import math
import os
import sys

SPECIALS = ["<unk>", "<s>", "</s>", "<sep>"]


def words(count: int) -> list[str]:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    out = []
    for first in syllables:
        for second in syllables:
            out.append(first + second)
    return out[:count]


def train_tokenizer(vocab_words):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    count = len(vocab_words)
    corpus = [" ".join([w] * (count - i)) for i, w in enumerate(vocab_words)]
    trainer = trainers.WordLevelTrainer(
        vocab_size=count + len(SPECIALS), special_tokens=SPECIALS, min_frequency=1
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    for i, w in enumerate(SPECIALS + vocab_words):
        if tok.token_to_id(w) != i:
            raise SystemExit(f"tokenizer training assigned {w!r} id {tok.token_to_id(w)}, expected {i}")
    return tok


def weights(recipe, vocab):
    import numpy as np

    rng = np.random.default_rng(recipe["seed"])
    hidden, head_dim, code = recipe["hidden_size"], 64, recipe["code_dim"]
    tok_dims = np.arange(0, code)
    const_dim = code
    prev_dims = np.arange(64, 64 + code)
    out_dims = np.arange(128, 128 + code)
    assert out_dims[-1] < hidden and code == 32
    codes = rng.choice([-1.0, 1.0], size=(vocab, code))
    const = math.sqrt(code)
    theta = recipe["rope_theta"]
    inv_freq = [theta ** (-2 * d / head_dim) for d in range(head_dim // 2)]

    def zeros(rows, cols):
        return np.zeros((rows, cols), dtype=np.float64)

    t = {}
    embed = zeros(vocab, hidden)
    embed[:, tok_dims] = codes
    embed[:, const_dim] = const
    t["model.embed_tokens.weight"] = embed
    heads = hidden // head_dim
    # layer 0 input: |x|² = code + const² = 2·code, so RMSNorm multiplies by sqrt(hidden / (2·code)).
    n0 = math.sqrt(hidden / (2 * code))
    q0, k0, v0, o0 = (
        zeros(hidden, hidden),
        zeros(hidden, hidden),
        zeros(hidden, hidden),
        zeros(hidden, hidden),
    )
    amp = recipe["prev_head_scale"]
    for d in range(16):  # fastest RoPE pairs (d, d+32)
        q0[d, const_dim] = amp * math.cos(inv_freq[d]) / (const * n0)
        q0[d + 32, const_dim] = -amp * math.sin(inv_freq[d]) / (const * n0)
        k0[d, const_dim] = 1.0 / (const * n0)
    for i in range(code):
        v0[i, tok_dims[i]] = 1.0 / n0
        o0[prev_dims[i], i] = 1.0
    # layer 1 input: TOK, CONST, PREV → |x|² = 3·code.
    n1 = math.sqrt(hidden / (3 * code))
    q1, k1, v1, o1 = (
        zeros(hidden, hidden),
        zeros(hidden, hidden),
        zeros(hidden, hidden),
        zeros(hidden, hidden),
    )
    alpha = recipe["copy_head_scale"]
    for i in range(code):
        slot = 16 + i if i < 16 else 48 + (i - 16)  # slowest RoPE pairs (16..31, 48..63)
        q1[slot, tok_dims[i]] = alpha / n1
        k1[slot, prev_dims[i]] = 1.0 / n1
        v1[i, tok_dims[i]] = 1.0 / n1
        o1[out_dims[i], i] = 1.0
    for layer, (q, k, v, o) in enumerate(((q0, k0, v0, o0), (q1, k1, v1, o1))):
        p = f"model.layers.{layer}."
        t[p + "self_attn.q_proj.weight"] = q
        t[p + "self_attn.k_proj.weight"] = k
        t[p + "self_attn.v_proj.weight"] = v
        t[p + "self_attn.o_proj.weight"] = o
        inter = recipe["intermediate_size"]
        t[p + "mlp.gate_proj.weight"] = zeros(inter, hidden)
        t[p + "mlp.up_proj.weight"] = zeros(inter, hidden)
        t[p + "mlp.down_proj.weight"] = zeros(hidden, inter)
        t[p + "input_layernorm.weight"] = np.ones(hidden)
        t[p + "post_attention_layernorm.weight"] = np.ones(hidden)
    t["model.norm.weight"] = np.ones(hidden)
    # final input: TOK, CONST, PREV, OUT → |x|² = 4·code.
    nf = math.sqrt(hidden / (4 * code))
    head = zeros(vocab, hidden)
    head[:, out_dims] = codes * recipe["lm_head_scale"] / nf
    t["lm_head.weight"] = head
    assert heads * head_dim == hidden
    return t


def self_check(model_dir, recipe, vocab_words):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    rng = np.random.default_rng(recipe["seed"] + 1)
    total = good = 0
    for length in (140, 260, 400):
        seq = rng.choice(len(vocab_words), size=length, replace=False) + len(SPECIALS)
        a = int(rng.integers(1, length - 9))
        ids = [1, *seq.tolist(), 3, int(seq[a])]
        want = seq[a + 1 : a + 9].tolist()
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None
            )
        got = out[0, len(ids) :].tolist()
        total += len(want)
        good += sum(int(x == y) for x, y in zip(got, want, strict=False))
    accuracy = good / total
    print(f"self-check: copy accuracy {accuracy:.3f} on {total} tokens")
    if accuracy < 0.95:
        raise SystemExit(f"the constructed model does not copy (accuracy {accuracy:.3f})")
    return accuracy


# ------------------------------------------------------------------------------------------ hybrids
#
# The hybrid ladder's models (recipe "kind"): a gated-delta-net hybrid (Qwen3Next: linear_attention layers
# beside full attention; vLLM refuses one without a MoE layer) and a Mamba2 hybrid (NemotronH). Weights are
# HF's own initialisation under a fixed torch seed (deterministic on CPU for one torch: the cache key names
# the image), with a larger initializer_range than HF's 0.02 so that a token's logits depend strongly on
# the recurrent state. They emit no meaningful text: a wrong recurrent state shows as a token or logprob
# difference from the control, which the hybrid ladder compares bit-exactly (the CPU noise floor is 0).


def hybrid_config(recipe):
    common = dict(
        vocab_size=recipe["vocab_size"],
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_attention_heads=recipe["hidden_size"] // 64,
        num_key_value_heads=recipe["hidden_size"] // 64,
        head_dim=64,
        max_position_embeddings=recipe["max_position_embeddings"],
        initializer_range=recipe["initializer_range"],
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if recipe["kind"] == "gdn-hybrid":
        from transformers import Qwen3NextConfig

        layers = recipe["layers"]
        return Qwen3NextConfig(
            **common,
            num_hidden_layers=len(layers),
            layer_types=list(layers),
            linear_conv_kernel_dim=4,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            # MoE on the recipe's layers (default: the last one); the others are dense MLPs
            decoder_sparse_step=1,
            mlp_only_layers=[
                i for i in range(len(layers)) if i not in recipe.get("moe_layers", [len(layers) - 1])
            ],
            num_experts=recipe.get("num_experts", 2),
            num_experts_per_tok=1,
            moe_intermediate_size=recipe["intermediate_size"],
            shared_expert_intermediate_size=recipe["intermediate_size"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            torch_dtype="bfloat16",
        )
    if recipe["kind"] == "mamba2-hybrid":
        from transformers import NemotronHConfig

        pattern = {"linear_attention": "M", "full_attention": "*", "mlp": "-"}
        return NemotronHConfig(
            **common,
            hybrid_override_pattern="".join(pattern[t] for t in recipe["layers"]),
            mamba_num_heads=4,
            mamba_head_dim=32,
            ssm_state_size=32,
            n_groups=1,
            conv_kernel=4,
            chunk_size=128,
            mlp_hidden_act="relu2",
            torch_dtype="bfloat16",
        )
    raise SystemExit(f"unknown tiny model kind {recipe['kind']!r}")


def recurrent_dependence(model, recipe):
    """How far the last position's logits move when only the first tokens change and every full
    attention layer's output is cut: what only the recurrent state carries across positions."""
    import numpy as np
    import torch

    cut = {
        name: param.detach().clone()
        for name, param in model.named_parameters()
        if name.endswith("o_proj.weight") and not name.startswith("lm_head")
    }
    rng = np.random.default_rng(recipe["seed"] + 1)
    seq = (rng.choice(recipe["vocab_size"] - len(SPECIALS), size=300) + len(SPECIALS)).tolist()
    other = list(seq)
    other[1:11] = (rng.choice(recipe["vocab_size"] - len(SPECIALS), size=10) + len(SPECIALS)).tolist()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in cut:
                param.zero_()
        a = model(torch.tensor([[1, *seq]])).logits[0, -1].float()
        b = model(torch.tensor([[1, *other]])).logits[0, -1].float()
        for name, param in model.named_parameters():
            if name in cut:
                param.copy_(cut[name])
        full = model(torch.tensor([[1, *seq]])).logits[0].float()
    if not torch.isfinite(full).all():
        raise SystemExit("the hybrid model's logits are not finite")
    return float((a - b).abs().max())


def write_hybrid(recipe, out):
    import torch
    from transformers import AutoModelForCausalLM

    config = hybrid_config(recipe)
    torch.manual_seed(recipe["seed"])
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.eval()
    # Slow decay: HF's A (up to 16 for GDN, 1..heads for Mamba2) forgets a token within a few steps, so a
    # wrong state at a block edge would move nothing hundreds of tokens later. A in [a_min, a_max] keeps
    # what came before the edge in the state until the answer.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                a = torch.linspace(recipe["a_min"], recipe["a_max"], param.numel(), dtype=torch.float64)
                param.copy_(a.log().reshape(param.shape))
            if name.endswith("dt_bias") and recipe.get("dt_bias") is not None:
                param.fill_(recipe["dt_bias"])
    moved = recurrent_dependence(model, recipe)
    print(f"self-check: recurrent state moves the last logits by {moved:.4g} (cut attention)")
    if moved < recipe["min_recurrent_dependence"]:
        raise SystemExit(
            f"the recurrent layers carry too little: the last logits moved {moved:.4g} "
            f"< {recipe['min_recurrent_dependence']} when only early tokens changed"
        )
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    return moved


def main():
    recipe = json.loads(sys.argv[1])
    out = sys.argv[2]
    import torch

    torch.set_num_threads(1)
    if recipe.get("kind") == "set":  # several models, each in its own subdirectory
        check = {}
        for key, member in sorted(recipe["members"].items()):
            os.makedirs(os.path.join(out, key))
            check[key] = write_model(member, os.path.join(out, key))
        check = {"members": check}
    else:
        check = write_model(recipe, out)
    with open(os.path.join(out, "servimg-model.json"), "w") as fh:
        json.dump({"recipe": recipe, **check}, fh, sort_keys=True, indent=1)


def write_model(recipe, out):
    """The tokenizer, config and weights of one model in `out`; returns its self-check's numbers."""
    from transformers import PreTrainedTokenizerFast

    vocab_words = words(recipe["vocab_size"] - len(SPECIALS))
    tok = train_tokenizer(vocab_words)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", sep_token="<sep>"
    )
    fast.save_pretrained(out)
    if recipe.get("kind", "copy") == "copy":
        return {"self_check_accuracy": write_copy(recipe, out, vocab_words)}
    return {"self_check_recurrent_dependence": write_hybrid(recipe, out)}


def write_copy(recipe, out, vocab_words):
    import numpy as np
    from safetensors.numpy import save_file
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=recipe["vocab_size"],
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=2,
        num_attention_heads=recipe["hidden_size"] // 64,
        num_key_value_heads=recipe["hidden_size"] // 64,
        head_dim=64,
        max_position_embeddings=recipe["max_position_embeddings"],
        rms_norm_eps=1e-6,
        rope_theta=recipe["rope_theta"],
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype=recipe["dtype"],
    )
    config.save_pretrained(out)
    tensors = {k: v.astype(np.float32) for k, v in sorted(weights(recipe, recipe["vocab_size"]).items())}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return self_check(out, recipe, vocab_words)


if __name__ == "__main__":
    main()
