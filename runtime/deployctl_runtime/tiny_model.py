"""`deployctl-runtime tiny-model DIR`: a small HF-format checkpoint with seeded random weights, for tests and demos.

Files: config.json, model.safetensors, tokenizer.json (byte-level BPE trained with `tokenizers` on data/corpus.txt),
tokenizer_config.json (ChatML chat template), generation_config.json (eos ids), manifest.sha256 (sha256sum format,
relative paths). Nothing is downloaded."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (  # ChatML; tools in a system block as Qwen2.5's template shows them
    "{% if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"  # Qwen3's switch, set through chat_template_kwargs
)
VOCAB_SIZE = 1024
SHAPES = {  # 2 layers, hidden 64, GQA 4:2; max_position_embeddings 4096 so servers can run max_model_len 2048+
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
                  head_dim=16, rope_theta=10000.0),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True,
                  head_dim=16, rope_theta=1000000.0),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True,
                  head_dim=32, rope_theta=1000000.0),
}


def corpus_path() -> Path:
    return Path(__file__).parent / "data" / "corpus.txt"


def train_tokenizer(vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE: every byte is a base token, so multi-byte UTF-8 characters (CJK, emoji) may span tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = corpus_path().read_text(encoding="utf-8")
    tok.train_from_iterator(text.splitlines(), trainer=trainer)
    return tok


def _weights(cfg: dict, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q_out = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_out = cfg["num_key_value_heads"] * cfg["head_dim"]

    def linear(out_f, in_f):
        return torch.randn(out_f, in_f, generator=g) / in_f ** 0.5

    w = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g),
         "model.norm.weight": torch.ones(hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = linear(q_out, hidden)
        w[p + "self_attn.k_proj.weight"] = linear(kv_out, hidden)
        w[p + "self_attn.v_proj.weight"] = linear(kv_out, hidden)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, q_out)
        if cfg["model_type"] == "qwen2":
            for name, n in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                w[p + f"self_attn.{name}_proj.bias"] = torch.randn(n, generator=g) * 0.1
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = torch.ones(cfg["head_dim"])
            w[p + "self_attn.k_norm.weight"] = torch.ones(cfg["head_dim"])
        w[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.down_proj.weight"] = linear(hidden, inter)
        w[p + "input_layernorm.weight"] = torch.ones(hidden)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = linear(vocab, hidden)
    return w


def write_manifest(model_dir: Path) -> Path:
    """manifest.sha256 in `sha256sum` format: '<hex>  <relative path>' per file, sorted, manifest excluded."""
    lines = []
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != "manifest.sha256"):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  {path.relative_to(model_dir).as_posix()}\n")
    out = model_dir / "manifest.sha256"
    out.write_text("".join(lines))
    return out


def write_tiny_model(out_dir: str | Path, arch: str = "llama", seed: int = 0, num_hidden_layers: int = 2,
                     hidden_size: int = 64) -> Path:
    """Write the checkpoint into out_dir (created) and return its path. Same arch + seed -> same bytes."""
    from safetensors.torch import save_file

    if arch not in SHAPES:
        raise ValueError(f"--arch {arch!r} is not one of {', '.join(SHAPES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    eos_id, end_id = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    shape = dict(SHAPES[arch])
    cfg = {
        **shape, "vocab_size": tok.get_vocab_size(), "hidden_size": hidden_size, "intermediate_size": 3 * hidden_size,
        "num_hidden_layers": num_hidden_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias":
        arch == "qwen2", "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": eos_id,
    }
    if arch == "qwen2":
        cfg["attention_bias"] = True
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(_weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 4096,
               "add_bos_token": False, "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    gen_cfg = {"eos_token_id": [eos_id, end_id], "pad_token_id": end_id}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    write_manifest(out)
    return out
