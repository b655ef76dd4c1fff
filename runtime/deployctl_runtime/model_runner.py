"""Tensors live here: the model, the paged KV cache, and a step's three stages: prepare inputs -> forward -> sample."""
from __future__ import annotations

import torch

from deployctl_runtime.attention import AttentionMetadata, PrefillChunk
from deployctl_runtime.input_batch import DECODE_GROUP_SIZE, StepInputs, prepare_inputs
from deployctl_runtime.loader import load_weights
from deployctl_runtime.model_config import ModelConfig
from deployctl_runtime.models import model_class
from deployctl_runtime.outputs import ModelRunnerOutput, SchedulerOutput
from deployctl_runtime.sampler import Sampler

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Loads the weights, owns the KV cache ([num_kv_heads, (num_blocks + 1) * block_size, head_dim] per layer for
    K and for V; the extra block is scratch for CUDA-graph padding rows), turns a SchedulerOutput into one forward
    pass and samples one token per request that reached its end.

    On CUDA, decodes use the Triton paged kernel and, once capture_cuda_graphs() ran, decode-only steps replay a
    CUDA graph. On CPU decodes use the C paged kernel (float32, where the host has a C compiler) or else the torch
    attention path; everything runs eagerly."""

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
        self.decode_kernel = self._decode_kernel(cfg)  # None: the torch path (attention.decode_torch)
        self.decode_group_size = DECODE_GROUP_SIZE  # torch decode path: decodes attended to per call
        self.kv_cache: torch.Tensor | None = None
        self.graphs = None  # DecodeGraphs once captured
        self.phase = "idle"  # execute()'s stage: "prepare_inputs", "forward", "sample" (the engine's step_phase)

    def _decode_kernel(self, cfg: ModelConfig):
        if self.device.type == "cuda":
            from deployctl_runtime.kernels.paged_attention import paged_decode

            return paged_decode
        from deployctl_runtime.kernels import cpu_kernels

        ops = cpu_kernels.native(torch.empty(0, dtype=self.dtype, device=self.device))
        if ops is None or not ops.supports_attention(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim):
            return None
        return ops.paged_decode

    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def allocate_kv_cache(self, num_blocks: int) -> None:
        c = self.cfg
        self.num_blocks = num_blocks
        self.graphs = None  # captured graphs point at the old cache
        self.kv_cache = torch.zeros(c.num_hidden_layers, 2, c.num_key_value_heads, (num_blocks + 1) * self.block_size,
                                    c.head_dim, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(self.model.model.layers):
            layer.self_attn.k_cache = self.kv_cache[i, 0]
            layer.self_attn.v_cache = self.kv_cache[i, 1]

    def kv_cache_bytes(self) -> int:
        """Bytes of the allocated KV cache tensor (0 when freed)."""
        return 0 if self.kv_cache is None else self.kv_cache.numel() * self.kv_cache.element_size()

    def release_kv_cache(self) -> None:
        """Free the KV cache and the CUDA graphs that point at it (sleep); torch.cuda.empty_cache() on CUDA."""
        self._free_kv_cache()

    def offload_weights(self) -> None:
        """CUDA: copy every parameter and buffer to pinned host memory and drop the device copy (sleep level 1).
        A no-op on CPU (the weights already live in host RAM)."""
        if self.device.type != "cuda":
            return
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            host.copy_(t.data, non_blocking=True)
            t.data = host
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def reload_weights(self) -> None:
        """CUDA: the parameters and buffers back on the device (wake); a no-op on CPU."""
        if self.device.type != "cuda":
            return
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            t.data = t.data.to(self.device, non_blocking=True)
        torch.cuda.synchronize(self.device)

    def _free_kv_cache(self) -> None:
        self.kv_cache = self.graphs = None
        for layer in self.model.model.layers:
            layer.self_attn.k_cache = layer.self_attn.v_cache = torch.empty(0)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def profile_activation_peak(self, num_tokens: int) -> int:
        """CUDA only: peak bytes above the weights for one prefill of num_tokens tokens (KV for it included)."""
        self.allocate_kv_cache(-(-num_tokens // self.block_size))
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
        self._free_kv_cache()
        return int(peak)

    def profile_cuda_graph_bytes(self, max_num_seqs: int, max_model_len: int) -> int:
        """CUDA only: device memory the decode graphs take, measured by capturing them over a one-block cache (their
        memory does not depend on the cache size), then freeing them. The engine subtracts it from the KV budget."""
        self.allocate_kv_cache(1)
        used = self.capture_cuda_graphs(max_num_seqs, max_model_len)
        self._free_kv_cache()
        return used

    def capture_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> int:
        """Capture decode graphs for every bucket up to max_num_seqs over the current cache; returns their bytes."""
        from deployctl_runtime.cuda_graphs import DecodeGraphs

        graphs = DecodeGraphs(self.model, self.decode_kernel, max_num_seqs, -(-max_model_len // self.block_size),
                              self.block_size, self.num_blocks * self.block_size, self.device)
        used = graphs.capture()
        self.graphs = graphs
        return used

    @torch.inference_mode()
    def warmup(self) -> None:
        """Check every weight is finite, then one prefill-shaped forward on block 0 (free at start; overwritten
        before use) whose logits must be finite. Raises ValueError naming the first tensors holding NaN or inf, or
        saying the forward overflowed (finite weights whose activations overflow the dtype, e.g. float16): either
        model would otherwise report ready and answer every request 500 non_finite_logits."""
        bad = [name for name, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:
            raise ValueError(f"the checkpoint's weights hold NaN or inf in {len(bad)} tensor(s), first "
                             f"{', '.join(bad[:3])}: the model files are corrupt; re-download or re-convert them")
        n = min(self.block_size, 8)
        pos = torch.arange(n, device=self.device)
        meta = AttentionMetadata(slot_mapping=pos.clone(), prefills=[PrefillChunk(0, n, n, None)])
        logits = self.model.compute_logits(
            self.model(torch.zeros(n, dtype=torch.long, device=self.device), pos, meta)[-1:])
        if not bool(torch.isfinite(logits).all()):
            dtype = str(self.dtype).removeprefix("torch.")
            fix = ("check the checkpoint (its weights overflow even float32)" if dtype == "float32" else
                   "serve it with --dtype float32" + (" or bfloat16" if dtype == "float16" else ""))
            raise ValueError(f"the warm-up forward pass gave non-finite logits (NaN or inf) in {dtype}: the model's "
                             f"activations overflow the dtype, so every request would fail; {fix}")

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.phase = "prepare_inputs"
        inputs = self.prepare_inputs(sched)
        self.phase = "forward"
        hidden = self.forward(inputs)
        self.phase = "sample"
        return self.sample(hidden, inputs)

    def prepare_inputs(self, sched: SchedulerOutput) -> StepInputs:
        return prepare_inputs(sched, self.block_size, self.device, self.decode_kernel, self.decode_group_size)

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Hidden states [T, hidden]: a CUDA graph replay when the step is decode-only and fits a bucket."""
        if self.graphs is not None and inputs.decode_only:
            hidden = self.graphs.replay(inputs.input_ids, inputs.positions, inputs.meta)
            if hidden is not None:
                return hidden
        return self.model(inputs.input_ids, inputs.positions, inputs.meta)

    def sample(self, hidden: torch.Tensor, inputs: StepInputs) -> ModelRunnerOutput:
        out = ModelRunnerOutput()
        if inputs.sample_rows is None:
            return out
        every_row = len(inputs.sample_reqs) == inputs.num_tokens  # e.g. a decode-only step
        rows = hidden if every_row else hidden[inputs.sample_rows]
        for req, sample in zip(inputs.sample_reqs, self.sampler(self.model.compute_logits(rows), inputs.sample_reqs)):
            out.sampled[req.request_id] = sample
        return out
