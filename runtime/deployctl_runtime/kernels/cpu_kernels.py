"""The CPU float32 path's own operators (cpu_ops.c): built once per machine with the host's C compiler, loaded with
ctypes, called on torch tensors' memory.

Why C and not torch: on the llama-8x512 bench shape, a 16-request decode forward spent 5.5 of 17.7 ms in the torch
decode attention (it copies every request's context out of the paged cache, per layer, before a masked SDPA) and
~2 ms more in RMSNorm, RoPE, SiLU and the residual adds, each a handful of torch ops on [16, 512] tensors
(bench/bench_forward.py). Here each is one pass: see cpu_ops.c.

Built with `$CC` (else `cc`/`gcc` on PATH) as `-O3 -march=native -fno-math-errno -fopenmp -shared`, into
`$DEPLOYCTL_RUNTIME_CACHE` (else `$XDG_CACHE_HOME/deployctl-runtime`, else `~/.cache/deployctl-runtime`; where that
cannot be written, `$TMPDIR/deployctl-runtime-UID`), under a
name that hashes the source, the compiler's version and this CPU's flags, so a copied cache never runs on a CPU it
was not built for. No compiler, a failed build or `DEPLOYCTL_CPU_KERNELS=0`: `load()` returns None and the model
keeps its torch ops (a warning says why, once). OpenMP resolves to the libgomp torch already loaded (same soname),
so these functions and torch share one thread pool; each call passes torch's thread count."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger("deployctl_runtime")

SOURCE = Path(__file__).with_name("cpu_ops.c")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC"]
BUILD_TIMEOUT_S = 120
MAX_GROUP, MAX_DIM = 64, 512  # cpu_ops.c's limits: query heads per KV head, head_dim

_P, _I, _I64, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "rms_norm_f32": [_P, _P, _P, _P, _I64, _I, _F, _I],
    "silu_mul_f32": [_P, _P, _I64, _I, _I],
    "rope_store_f32": [_P, _I64, _I64, _I, _I, _I, _P, _P, _P, _P, _F, _P, _P, _I64, _P, _I],
    "paged_decode_f32": [_P, _I64, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I64, _I, _I, _F, _I],
    "row_argmax_finite_f32": [_P, _I64, _I64, _P, _P],
}


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class CPUOps:
    """The loaded operators, on float32 CPU tensors. Shapes are each method's; tensors named contiguous must be."""

    def __init__(self, lib: ctypes.CDLL):
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = _I if name == "paged_decode_f32" else None
        self._lib = lib

    @staticmethod
    def supports_attention(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        return num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= MAX_GROUP and head_dim <= MAX_DIM \
            and head_dim % 2 == 0

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., dim] contiguous -> x / sqrt(mean(x^2) + eps) * weight, a new tensor. With residual (same shape,
        contiguous): residual += x in place, and the result normalises that sum, written over x (vLLM's
        fused_add_rms_norm)."""
        dim = x.shape[-1]
        out = torch.empty_like(x) if residual is None else x
        self._lib.rms_norm_f32(x.data_ptr(), _ptr(residual), weight.data_ptr(), out.data_ptr(), x.numel() // dim,
                               dim, eps, torch.get_num_threads())
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2 * I] contiguous -> silu(gate) * up, [T, I]."""
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = gate_up.new_empty(rows, inter)
        self._lib.silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads())
        return out

    def rope_store(self, qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                   cos: torch.Tensor, sin: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                   eps: float, k_cache: torch.Tensor | None, v_cache: torch.Tensor | None,
                   slots: torch.Tensor | None) -> None:
        """In place on qkv [T, >= (H + 2 KVH) * D] (rows contiguous): per-head RMSNorm of q and k when q_norm/k_norm
        [D] are given, RoPE of q and k (cos/sin [T, D] contiguous, sin signed as layers.RotaryEmbedding keeps it),
        then each token's k and v stored at slots [T] int64 of the caches [KVH, num_slots, D] (None: not stored)."""
        self._lib.rope_store_f32(qkv.data_ptr(), qkv.shape[0], qkv.stride(0), num_heads, num_kv_heads, head_dim,
                                 cos.data_ptr(), sin.data_ptr(), _ptr(q_norm), _ptr(k_norm), eps, _ptr(k_cache),
                                 _ptr(v_cache), 0 if k_cache is None else k_cache.shape[1], _ptr(slots),
                                 torch.get_num_threads())

    def argmax_finite(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
        """logits [N, V] contiguous -> (argmax [N] long, finite [N]): each row's first maximum and whether every
        element of it is finite, in one read (the sampler's greedy path). A non-finite row's argmax is undefined."""
        rows, vocab = logits.shape
        idx = torch.empty(rows, dtype=torch.long)
        finite = torch.empty(rows, dtype=torch.uint8)
        self._lib.row_argmax_finite_f32(logits.data_ptr(), rows, vocab, idx.data_ptr(), finite.data_ptr())
        return idx, [bool(f) for f in finite.tolist()]

    def paged_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     block_size: int) -> torch.Tensor:
        """q [n, H, D] (each row's heads contiguous; rows may be apart, as a view into qkv), k_cache/v_cache
        [KVH, num_slots, D] contiguous, block_tables [n, W] int32, context_lens [n] int32 -> [n, H, D]. The same
        signature as kernels.paged_attention.paged_decode (attention.AttentionMetadata.decode_kernel). Raises
        ValueError for shapes outside supports_attention()."""
        n, num_heads, head_dim = q.shape
        if q.stride(2) != 1 or q.stride(1) != head_dim:
            q = q.contiguous()
        kvh = k_cache.shape[0]
        out = q.new_empty(n, num_heads, head_dim)
        rc = self._lib.paged_decode_f32(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                        block_tables.data_ptr(), context_lens.data_ptr(), out.data_ptr(), n, kvh,
                                        num_heads // kvh, head_dim, k_cache.shape[1], block_tables.shape[1],
                                        block_size, scale, torch.get_num_threads())
        if rc != 0:
            raise ValueError(f"CPU paged decode: {num_heads} heads over {kvh} KV heads of dim {head_dim} not "
                             f"supported (at most {MAX_GROUP} per KV head, dim <= {MAX_DIM})")
        return out


def cache_dir() -> Path:
    root = os.environ.get("DEPLOYCTL_RUNTIME_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deployctl-runtime"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


class BuildFailed(OSError):
    """The compiler refused cpu_ops.c (its message attached)."""


def build(cc: str, out_dir: Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile cpu_ops.c into out_dir (atomically: a temp file renamed over) and return its path; reuses a build of
    the same source, compiler, flags and CPU. extra_flags go after FLAGS (tests build the narrower vector paths with
    -mno-avx512f / -mno-avx). Raises BuildFailed (with the compiler's message), OSError (the folder) or subprocess errors."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = [*FLAGS, *extra_flags]
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, " ".join(flags), _cpu_flags()]).encode())
    target = out_dir / f"cpu_ops-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        res = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                             timeout=BUILD_TIMEOUT_S)
        if res.returncode != 0:
            raise BuildFailed(f"{cc} exited {res.returncode}: {res.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.lru_cache(maxsize=1)
def load() -> CPUOps | None:
    """The operators, built on first use; None (with one warning naming why) when they cannot be had here."""
    if os.environ.get("DEPLOYCTL_CPU_KERNELS", "1") == "0":
        return None
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler (cc/gcc, or $CC): the CPU path runs on torch's ops (slower decode attention, "
                    "norms, RoPE)")
        return None
    try:
        try:
            path = build(cc, cache_dir())
        except BuildFailed:
            raise
        except OSError:  # a cache folder that cannot be written (a system account's home): the user's temp folder
            path = build(cc, Path(tempfile.gettempdir()) / f"deployctl-runtime-{os.getuid()}")
        ops = CPUOps(ctypes.CDLL(str(path)))
        log.info("CPU operators (decode attention, norms, RoPE, SiLU, greedy argmax): %s", path)
        return ops
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("CPU operators not built (%s): the CPU path runs on torch's ops", e)
        return None


_disabled = False


def native(t: torch.Tensor) -> CPUOps | None:
    """The operators for tensors like t (float32 on the CPU), or None: the caller takes its torch ops."""
    if _disabled or t.dtype != torch.float32 or t.device.type != "cpu":
        return None
    return load()


@contextmanager
def disabled():
    """Within: native() answers None, so models run their torch ops (the reference, in tests and benches)."""
    global _disabled
    before, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = before
