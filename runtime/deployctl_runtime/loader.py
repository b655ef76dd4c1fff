"""Load HF safetensors weights (one file or shards listed in model.safetensors.index.json) into a model.

A checkpoint that does not match its config fails with the tensor name and both shapes."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from safetensors import safe_open

# HF name fragment -> (our fused parameter fragment, shard index)
STACKED = {
    ".q_proj.": (".qkv_proj.", 0), ".k_proj.": (".qkv_proj.", 1), ".v_proj.": (".qkv_proj.", 2),
    ".gate_proj.": (".gate_up_proj.", 0), ".up_proj.": (".gate_up_proj.", 1),
}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """The checkpoint does not match the config: names the tensor and the shapes."""


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({model_dir / f for f in weight_map.values()})
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"model: no *.safetensors files in {model_dir}; only safetensors checkpoints load")
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"model: {f.name} is listed in model.safetensors.index.json but missing in {model_dir}")
    return files


def _shard_slice(param: torch.Tensor, fragment: str, shard: int, cfg) -> tuple[int, int]:
    if fragment == ".qkv_proj.":
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        return [(0, q), (q, q + kv), (q + kv, q + 2 * kv)][shard]
    inter = cfg.intermediate_size
    return [(0, inter), (inter, 2 * inter)][shard]


def load_weights(model: nn.Module, model_dir: str | Path) -> None:
    """Copy every checkpoint tensor into its parameter (converted to the parameter's dtype and device).

    Raises CheckpointError for a shape mismatch (tensor name, checkpoint shape, expected shape), an unknown tensor,
    or a parameter the checkpoint lacks (lm_head may be absent when embeddings are tied)."""
    model_dir = Path(model_dir)
    cfg = model.config
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in safetensors_files(model_dir):
        try:
            handle = safe_open(str(file), framework="pt")
        except Exception as exc:  # SafetensorError: truncated or corrupt header
            raise CheckpointError(f"model: {file} is not a readable safetensors file ({exc}); re-download it") from exc
        with handle as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                target = name
                for fragment, (fused, shard) in STACKED.items():
                    if fragment in name:
                        target = name.replace(fragment, fused)
                        break
                param = params.get(target)
                if param is None:
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue
                    raise CheckpointError(f"{file.name}: tensor {name} does not belong to a {cfg.family} model")
                if target != name:
                    lo, hi = _shard_slice(param, fused, shard, cfg)
                    dest = param.data[lo:hi]
                else:
                    dest = param.data
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(dest.shape):
                    raise CheckpointError(f"{file.name}: tensor {name} has shape {tuple(tensor.shape)} but config.json "
                                          f"implies {tuple(dest.shape)}")
                dest.copy_(tensor.to(dest.dtype))
                loaded.add(name)
    missing = []
    for pname in params:
        if pname == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        names = [pname.replace(fused, frag) for frag, (fused, _) in STACKED.items() if fused in pname] or [pname]
        missing += [n for n in names if n not in loaded]
    if missing:
        raise CheckpointError(f"model: checkpoint in {model_dir} lacks tensor {missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
