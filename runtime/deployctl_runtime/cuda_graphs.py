"""CUDA graphs for decode-only steps: one graph per batch-size bucket (1, 2, 4, 8, 16, then every 16 up to
max_num_seqs, as vLLM's capture sizes), captured over static input buffers and replayed when a step has no prefill.

A step of n decodes replays the smallest bucket >= n: its inputs are copied into the first n rows of the static
buffers; the padding rows read block 0 with context length 1 and write their K/V to the scratch slot (the extra
block the model runner allocates past the pool), so they touch no request's cache. All buckets share one memory
pool, captured largest first (PyTorch's "graph pool" sharing; vLLM does the same)."""
from __future__ import annotations

import torch

from deployctl_runtime.attention import AttentionMetadata


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Bucket sizes up to max_num_seqs (which is always one): 1, 2, 4, 8, 16, 32, 48, ..."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 16))
    return sizes + [max_num_seqs]


class DecodeGraphs:
    """Captured decode forwards of `model` (input_ids [B], positions [B], meta) -> hidden [B, hidden], decodes through
    `decode_kernel` (kernels.paged_attention.paged_decode on CUDA).

    Buffers: input_ids, positions, slot_mapping [max_num_seqs] long; block_tables [max_num_seqs, max_blocks] int32;
    context_lens [max_num_seqs] int32."""

    def __init__(self, model, decode_kernel, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 scratch_slot: int, device: torch.device):
        self.model = model
        self.decode_kernel = decode_kernel
        self.sizes = capture_sizes(max_num_seqs)
        self.block_size = block_size
        self.scratch_slot = scratch_slot
        self.device = device
        n, w = max_num_seqs, max_blocks_per_seq
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), scratch_slot, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(n, w, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph | None] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.memory_bytes = 0
        self.num_replays = 0

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slot_mapping[:b], num_decodes=b,
                                 decode_kernel=self.decode_kernel,
                                 block_tables=self.block_tables[:b], context_lens=self.context_lens[:b],
                                 block_size=self.block_size)

    @torch.inference_mode()
    def capture(self) -> int:
        """Capture every bucket; returns the device memory they took (bytes: the drop in free memory). Off CUDA
        (tests) nothing is captured and replay() reruns the forward on the static buffers: the same buffer and
        padding logic, no graph."""
        if self.device.type != "cuda":
            self.graphs = dict.fromkeys(self.sizes)
            return 0
        torch.cuda.synchronize(self.device)
        free_before = torch.cuda.mem_get_info(self.device)[0]
        pool = None
        for b in reversed(self.sizes):
            args = (self.input_ids[:b], self.positions[:b], self._meta(b))
            self.model(*args)  # warm-up outside the graph: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self.model(*args)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize(self.device)
        self.memory_bytes = max(0, free_before - torch.cuda.mem_get_info(self.device)[0])
        return self.memory_bytes

    def bucket(self, n: int) -> int | None:
        return next((s for s in self.sizes if s >= n), None)

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """Hidden states [n, hidden] of a decode-only step of n tokens, or None when n exceeds every bucket or the
        block tables are wider than the buffers (the caller then runs eagerly)."""
        n = input_ids.shape[0]
        b = self.bucket(n)
        width = meta.block_tables.shape[1]
        if b is None or width > self.block_tables.shape[1]:
            return None
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        self.context_lens[:n].copy_(meta.context_lens)
        if b > n:  # padding rows: previous steps' values would write into live blocks
            self.slot_mapping[n:b].fill_(self.scratch_slot)
            self.context_lens[n:b].fill_(1)
            self.block_tables[n:b].zero_()
        graph = self.graphs[b]
        if graph is None:
            self.outputs[b] = self.model(self.input_ids[:b], self.positions[:b], self._meta(b))
        else:
            graph.replay()
        self.num_replays += 1
        return self.outputs[b][:n]
