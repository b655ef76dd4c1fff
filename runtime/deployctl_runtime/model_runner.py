"""Tensors live here: the model, the paged KV cache, the flat batch of each step, and sampling."""
from __future__ import annotations

import torch

from deployctl_runtime.attention import AttentionMetadata, DecodeGroup, PrefillChunk
from deployctl_runtime.loader import load_weights
from deployctl_runtime.model_config import ModelConfig
from deployctl_runtime.models import model_class
from deployctl_runtime.sampler import Sampler
from deployctl_runtime.scheduler import ModelRunnerOutput, SchedulerOutput

DECODE_GROUP_SIZE = 16  # decodes sorted by context length are attended to in groups of this many

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Loads the weights, owns the KV cache ([num_kv_heads, num_blocks * block_size, head_dim] per layer for K
    and for V), turns a SchedulerOutput into one forward pass and samples one token per request that reached its end."""

    def __init__(self, cfg: ModelConfig, model_dir: str, device: str, dtype: str, block_size: int, seed: int = 0):
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = TORCH_DTYPES[dtype]
        self.block_size = block_size
        torch.manual_seed(seed)
        with torch.device(self.device):
            model = model_class(cfg.family)(cfg)
        model.to(self.dtype)
        # rotary tables stay float32 for accuracy
        model.model.rotary.to(torch.float32)
        load_weights(model, model_dir)
        self.model = model.eval()
        self.sampler = Sampler(self.device, seed)
        self.num_blocks = 0
        self.decode_group_size = DECODE_GROUP_SIZE
        self.kv_cache: torch.Tensor | None = None

    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def allocate_kv_cache(self, num_blocks: int) -> None:
        c = self.cfg
        self.num_blocks = num_blocks
        self.kv_cache = torch.zeros(c.num_hidden_layers, 2, c.num_key_value_heads, num_blocks * self.block_size,
                                    c.head_dim, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(self.model.model.layers):
            layer.self_attn.k_cache = self.kv_cache[i, 0]
            layer.self_attn.v_cache = self.kv_cache[i, 1]

    @torch.inference_mode()
    def profile_activation_peak(self, num_tokens: int) -> int:
        """CUDA only: peak bytes above the weights for one prefill of num_tokens tokens (KV for it included)."""
        blocks = -(-num_tokens // self.block_size)
        self.allocate_kv_cache(blocks)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pos = torch.arange(num_tokens, device=self.device)
        meta = AttentionMetadata(slot_mapping=pos.clone(), prefills=[PrefillChunk(0, num_tokens, num_tokens, None)])
        hidden = self.model(ids, pos, meta)
        self.model.compute_logits(hidden[-1:])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        self.kv_cache = None
        for layer in self.model.model.layers:
            layer.self_attn.k_cache = layer.self_attn.v_cache = torch.empty(0)
        torch.cuda.empty_cache()
        return int(peak)

    @torch.inference_mode()
    def warmup(self) -> None:
        """One decode-shaped and one prefill-shaped forward on block 0 (free at start; overwritten before use)."""
        n = min(self.block_size, 8)
        pos = torch.arange(n, device=self.device)
        meta = AttentionMetadata(slot_mapping=pos.clone(), prefills=[PrefillChunk(0, n, n, None)])
        self.model.compute_logits(self.model(torch.zeros(n, dtype=torch.long, device=self.device), pos, meta)[-1:])

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        bs = self.block_size
        # decodes first, shortest context first (so groups pad little), then prefill chunks
        items = sorted(sched.scheduled, key=lambda s: (s.num_scheduled_tokens != 1,
                                                       s.request.num_computed_tokens if s.num_scheduled_tokens == 1
                                                       else 0))
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decode_tables, decode_lens = [], []
        prefills: list[PrefillChunk] = []
        sample_rows, sample_reqs = [], []
        for item in items:
            req, n, table = item.request, item.num_scheduled_tokens, item.block_ids
            start = req.num_computed_tokens
            end = start + n
            begin = len(token_ids)
            token_ids.extend(req.all_token_ids[start:end])
            positions.extend(range(start, end))
            if n == 1:
                slots.append(table[start // bs] * bs + start % bs)
                decode_tables.append(table[:-(-end // bs)])
                decode_lens.append(end)
            else:
                for b in range(start // bs, (end - 1) // bs + 1):  # one range per block, not per token
                    base = table[b] * bs - b * bs
                    slots.extend(range(base + max(start, b * bs), base + min(end, (b + 1) * bs)))
                ctx_slots = None
                if start > 0:
                    nb = -(-end // bs)
                    t = torch.tensor(table[:nb], dtype=torch.long)
                    ctx_slots = (t.unsqueeze(1) * bs + torch.arange(bs)).flatten()[:end].to(self.device)
                prefills.append(PrefillChunk(begin, begin + n, end, ctx_slots))
            if item.samples:
                sample_rows.append(len(token_ids) - 1)
                sample_reqs.append(req)
        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
                                 num_decodes=len(decode_lens), prefills=prefills)
        size = self.decode_group_size
        for g in range(0, len(decode_lens), size):
            meta.decode_groups.append(self._decode_group(g, decode_tables[g:g + size], decode_lens[g:g + size]))
        hidden = self.model(torch.tensor(token_ids, dtype=torch.long, device=dev),
                            torch.tensor(positions, dtype=torch.long, device=dev), meta)
        out = ModelRunnerOutput()
        if sample_rows:
            logits = self.model.compute_logits(hidden[torch.tensor(sample_rows, device=dev)])
            for req, sample in zip(sample_reqs, self.sampler(logits, sample_reqs)):
                out.sampled[req.request_id] = sample
        return out

    def _decode_group(self, start: int, tables: list[list[int]], lens: list[int]) -> DecodeGroup:
        bs, dev = self.block_size, self.device
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=dev)
        slots = (table.unsqueeze(2) * bs + torch.arange(bs, device=dev)).flatten()
        valid = torch.arange(width * bs, device=dev).unsqueeze(0) < torch.tensor(lens, device=dev).unsqueeze(1)
        return DecodeGroup(start, start + len(lens), slots, width * bs, valid[None, :, None, :])
