"""Prepare-inputs stage of a step: turn a SchedulerOutput into the flat token batch and the attention metadata.

Every tensor is built once per step, from Python lists in one torch.tensor call each, and shared by every layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from deployctl_runtime.attention import AttentionMetadata, PrefillChunk, decode_group
from deployctl_runtime.outputs import SchedulerOutput
from deployctl_runtime.request import Request

DECODE_GROUP_SIZE = 16  # torch path: decodes sorted by context length are attended to in groups of this many


@dataclass
class StepInputs:
    """input_ids/positions [T] long; sample_rows [N] long (rows of the flat batch whose logits are sampled, in the
    order of sample_reqs), None when nothing samples. decode_only: no prefill chunk (a CUDA graph may replay)."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor | None
    sample_reqs: list[Request]
    decode_only: bool
    num_tokens: int


def prepare_inputs(sched: SchedulerOutput, block_size: int, device: torch.device,
                   decode_kernel: Callable | None = None, group_size: int = DECODE_GROUP_SIZE) -> StepInputs:
    """Decodes first, shortest context first (so torch-path groups pad little), then prefill chunks. With a
    decode_kernel (attention.AttentionMetadata), decodes get int32 block tables and context lengths; without one,
    torch-path decode groups."""
    bs = block_size
    items = sorted(sched.scheduled, key=lambda s: (s.num_scheduled_tokens != 1,
                                                   s.request.num_computed_tokens if s.num_scheduled_tokens == 1
                                                   else 0))
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    decode_tables: list[list[int]] = []
    decode_lens: list[int] = []
    prefills: list[PrefillChunk] = []
    sample_rows: list[int] = []
    sample_reqs: list[Request] = []
    for item in items:
        req, n, table = item.request, item.num_scheduled_tokens, item.block_ids
        start = req.num_computed_tokens
        end = start + n
        begin = len(token_ids)
        if n == 1:
            token_ids.append(req.all_token_ids[start])
            positions.append(start)
            slots.append(table[start // bs] * bs + start % bs)
            decode_tables.append(table[:-(-end // bs)])
            decode_lens.append(end)
        else:
            token_ids.extend(req.all_token_ids[start:end])
            positions.extend(range(start, end))
            for b in range(start // bs, (end - 1) // bs + 1):  # one range per block, not per token
                base = table[b] * bs - b * bs
                slots.extend(range(base + max(start, b * bs), base + min(end, (b + 1) * bs)))
            ctx_slots = None
            if start > 0:
                t = torch.tensor(table[:-(-end // bs)], dtype=torch.long)
                ctx_slots = (t.unsqueeze(1) * bs + torch.arange(bs)).flatten()[:end].to(device)
            prefills.append(PrefillChunk(begin, begin + n, end, ctx_slots))
        if item.samples:
            sample_rows.append(len(token_ids) - 1)
            sample_reqs.append(req)
    nd = len(decode_lens)
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots, dtype=torch.long, device=device), num_decodes=nd,
                             prefills=prefills, decode_kernel=decode_kernel, block_size=bs)
    if nd:
        width = max(len(t) for t in decode_tables)
        padded = [t + [0] * (width - len(t)) for t in decode_tables]
        if decode_kernel is not None:
            meta.block_tables = torch.tensor(padded, dtype=torch.int32, device=device)
            meta.context_lens = torch.tensor(decode_lens, dtype=torch.int32, device=device)
        else:
            table = torch.tensor(padded, dtype=torch.long, device=device)
            for g in range(0, nd, group_size):
                lens = decode_lens[g:g + group_size]
                w = -(-max(lens) // bs)
                meta.decode_groups.append(decode_group(g, table[g:g + group_size, :w], lens, bs))
    rows = torch.tensor(sample_rows, dtype=torch.long, device=device) if sample_rows else None
    return StepInputs(torch.tensor(token_ids, dtype=torch.long, device=device),
                      torch.tensor(positions, dtype=torch.long, device=device), meta, rows, sample_reqs,
                      not prefills, len(token_ids))
