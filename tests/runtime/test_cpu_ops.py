"""The CPU float32 path's C operators (kernels/cpu_ops.c) against the torch ops they replace, the engine's tokens with
and without them, and how they are built: cached per source/compiler/CPU, and a host without a compiler serves on
torch's ops with a warning."""
from __future__ import annotations

import ctypes
import logging
import math
import os
import platform
import subprocess
import sys

import pytest
import torch

from deployctl_runtime import LLM, SamplingParams
from deployctl_runtime.kernels import cpu_kernels
from deployctl_runtime.layers import GatedMLP, RMSNorm, RotaryEmbedding

from test_decode_attention import _reference

ops = cpu_kernels.load()
pytestmark = pytest.mark.skipif(ops is None, reason="no C compiler here: the CPU operators are not built")


def _close(got, want, tol=2e-6):
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("rows,dim,spread", [(16, 512, 1.0), (300, 512, 1e-3), (7, 96, 1e3), (200, 1024, 1.0)])
def test_rms_norm_and_the_fused_residual_add_match_torch(rows, dim, spread):
    """(200, 1024) is over the two-thread threshold: rows split between threads give the same answer."""
    g = torch.Generator().manual_seed(rows)
    norm = RMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=g))
    x, res = torch.randn(rows, dim, generator=g) * spread, torch.randn(rows, dim, generator=g) * spread
    with torch.inference_mode():
        with cpu_kernels.disabled():
            want, (want_fused, want_res) = norm(x), norm(x.clone(), res.clone())
        got = norm(x)
        x2, res2 = x.clone(), res.clone()
        got_fused, got_res = norm(x2, res2)
    _close(got, want)
    assert torch.equal(got_res, want_res)  # the add itself is exact
    _close(got_fused, want_fused)
    assert got_fused.data_ptr() == x2.data_ptr() and got_res.data_ptr() == res2.data_ptr()  # in place, as vLLM's


@pytest.mark.parametrize("rows", [1, 16, 100])
def test_silu_mul_matches_torch(rows):
    g = torch.Generator().manual_seed(rows)
    mlp = GatedMLP(64, 768)
    x = torch.randn(rows, 64, generator=g) * 3
    with torch.inference_mode():
        with cpu_kernels.disabled():
            want = mlp(x)
        got = mlp(x)
    _close(got, want, 1e-5)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,qk_norm", [(8, 2, 64, False), (4, 4, 24, True),
                                                                    (16, 8, 128, True)])
def test_rope_store_rotates_in_place_and_fills_the_cache(num_heads, num_kv_heads, head_dim, qk_norm):
    """Against the torch path: q/k norm per head (Qwen3), RotaryEmbedding.rotate, index_copy_ into the caches."""
    g = torch.Generator().manual_seed(head_dim)
    t, q_size, kv_size = 37, num_heads * head_dim, num_kv_heads * head_dim
    rotary = RotaryEmbedding(head_dim, 4096, 10000.0, None)
    positions = torch.randint(0, 4000, (t,), generator=g)
    cos, sin = rotary.tables(positions)
    qkv = torch.randn(t, q_size + 2 * kv_size, generator=g)
    q_norm = k_norm = None
    if qk_norm:
        q_norm, k_norm = RMSNorm(head_dim, 1e-6), RMSNorm(head_dim, 1e-6)
        with torch.no_grad():
            q_norm.weight.copy_(torch.rand(head_dim, generator=g) + 0.5)
            k_norm.weight.copy_(torch.rand(head_dim, generator=g) + 0.5)
    slots = torch.randperm(200, generator=g)[:t]
    with torch.inference_mode(), cpu_kernels.disabled():
        q = qkv[:, :q_size].view(t, num_heads, head_dim)
        k = qkv[:, q_size:q_size + kv_size].view(t, num_kv_heads, head_dim)
        if qk_norm:
            q, k = q_norm(q), k_norm(k)
        want_q, want_k = rotary(rotary.tables(positions), q, k)
        want_v = qkv[:, q_size + kv_size:].view(t, num_kv_heads, head_dim)
        want_kc, want_vc = torch.zeros(2, num_kv_heads, 200, head_dim)
        want_kc.index_copy_(1, slots, want_k.transpose(0, 1))
        want_vc.index_copy_(1, slots, want_v.transpose(0, 1))
    got = qkv.clone()
    kc, vc = torch.zeros(2, num_kv_heads, 200, head_dim)
    ops.rope_store(got, num_heads, num_kv_heads, head_dim, cos, sin, q_norm and q_norm.weight.detach(),
                   k_norm and k_norm.weight.detach(), 1e-6, kc, vc, slots)
    _close(got[:, :q_size].view(t, num_heads, head_dim), want_q, 1e-5)
    _close(got[:, q_size:q_size + kv_size].view(t, num_kv_heads, head_dim), want_k, 1e-5)
    assert torch.equal(got[:, q_size + kv_size:], qkv[:, q_size + kv_size:])  # v untouched
    _close(kc, want_kc, 1e-5)
    assert torch.equal(vc, want_vc)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size,lens", [
    (8, 2, 64, 16, [1, 17, 40, 33]),  # GQA 4:1; one token of context; partial last blocks
    (4, 4, 32, 16, [16, 5]),  # no grouping; exactly one full block
    (6, 1, 24, 16, [50, 2, 31]),  # multi-query, head size not a power of two
    (16, 2, 128, 32, [300, 97]),  # group of 8, many tiles of 32 (the running max rises across them)
    (8, 8, 64, 16, [700] * 6),  # enough work for two threads
])
def test_paged_decode_equals_each_request_alone(num_heads, num_kv_heads, head_dim, block_size, lens):
    g = torch.Generator().manual_seed(len(lens) * head_dim)
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 4
    perm = torch.randperm(num_blocks - 1, generator=g) + 1
    tables, used = [], 0
    for nb in need:
        tables.append(perm[used:used + nb].tolist() + [0] * (max(need) - nb))
        used += nb
    kv = torch.randn(2, num_kv_heads, num_blocks * block_size, head_dim, generator=g)
    # q as the model passes it: a view into qkv whose rows are wider than the heads
    qkv = torch.randn(len(lens), (num_heads + 2 * num_kv_heads) * head_dim, generator=g) * 2
    q = qkv[:, :num_heads * head_dim].view(len(lens), num_heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    want = _reference(q, kv[0], kv[1], tables, lens, block_size, scale)
    got = ops.paged_decode(q, kv[0], kv[1], torch.tensor(tables, dtype=torch.int32),
                           torch.tensor(lens, dtype=torch.int32), scale, block_size)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_paged_decode_refuses_what_it_cannot_take():
    q = torch.randn(1, 130, 8)
    kv = torch.randn(2, 2, 16, 8)
    assert not ops.supports_attention(130, 2, 8)
    with pytest.raises(ValueError, match="65 per KV head|at most 64"):
        ops.paged_decode(q, kv[0], kv[1], torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                         0.1, 16)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_tokens_are_the_torch_paths(tiny_model_factory, arch):
    """Prefill chunks, decodes and mixed steps (a token budget of 32) on the C operators and on torch's: the same
    greedy tokens, and logprobs within float rounding."""
    path = tiny_model_factory(arch)
    prompts = [list(range(5, 60)), [7, 8, 9], list(range(100, 140))]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    with cpu_kernels.disabled():
        ref_llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=64, max_num_batched_tokens=32)
        want = ref_llm.generate(prompts, params)
    assert ref_llm.engine.runner.decode_kernel is None
    llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=64, max_num_batched_tokens=32)
    assert llm.engine.runner.decode_kernel is not None
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_build_is_cached_and_a_host_without_a_compiler_serves_on_torch(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DEPLOYCTL_RUNTIME_CACHE", str(tmp_path / "cache"))
    cc = cpu_kernels._compiler()
    first = cpu_kernels.build(cc, tmp_path / "cache")
    mtime = first.stat().st_mtime_ns
    assert cpu_kernels.build(cc, tmp_path / "cache") == first and first.stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]  # no temp file left
    try:
        cpu_kernels.load.cache_clear()
        monkeypatch.setenv("CC", "no-such-cc")
        with caplog.at_level(logging.WARNING, logger="deployctl_runtime"):
            assert cpu_kernels.load() is None
        assert "no C compiler" in caplog.text
        cpu_kernels.load.cache_clear()
        monkeypatch.setenv("CC", cc)
        monkeypatch.setenv("DEPLOYCTL_CPU_KERNELS", "0")
        assert cpu_kernels.load() is None
    finally:
        cpu_kernels.load.cache_clear()


def test_a_compile_error_is_reported_not_raised(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    monkeypatch.setattr(cpu_kernels, "SOURCE", bad)
    monkeypatch.setenv("DEPLOYCTL_RUNTIME_CACHE", str(tmp_path / "cache"))
    try:
        cpu_kernels.load.cache_clear()
        with caplog.at_level(logging.WARNING, logger="deployctl_runtime"):
            assert cpu_kernels.load() is None
        assert "not built" in caplog.text and "exited" in caplog.text
        assert not list((tmp_path / "cache").glob("*.so"))
    finally:
        cpu_kernels.load.cache_clear()


def test_one_openmp_runtime_in_the_process():
    """The operators' OpenMP is torch's libgomp (one thread pool), not a second copy from the system."""
    code = ("import torch; from deployctl_runtime.kernels import cpu_kernels; assert cpu_kernels.load();"
            "maps = open('/proc/self/maps').read().splitlines();"
            "print(sorted({l.split()[-1] for l in maps if 'libgomp' in l}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.count("libgomp") == 1, out
    assert "torch" in out


def test_rope_tables_are_what_rope_store_reads():
    """rope_store reads cos/sin rows [T, D] contiguous: RotaryEmbedding.tables gives them so."""
    rotary = RotaryEmbedding(64, 128, 10000.0, None)
    cos, sin = rotary.tables(torch.tensor([3, 0, 127]))
    assert cos.is_contiguous() and sin.is_contiguous() and cos.shape == (3, 1, 64)
    assert torch.equal(cos[0, 0], rotary.cos[3]) and torch.equal(sin[2, 0], rotary.sin[127])


@pytest.mark.parametrize("vocab", [32000, 151936, 1000, 7])
def test_argmax_finite_is_torchs_first_maximum_and_flags_non_finite_rows(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=g)
    x[1, vocab // 3] = x[1, vocab - 1] = 50.0  # a tie: the first index wins, as torch.argmax
    x[2] = 0.0  # all equal: index 0
    x[3, vocab // 2] = float("nan")
    x[4, 0] = float("-inf")
    x[5, vocab - 1] = float("inf")
    idx, finite = ops.argmax_finite(x)
    assert finite == [True, True, True, False, False, False]
    assert idx[:3].tolist() == x[:3].argmax(-1).tolist()
    assert idx[1].item() == vocab // 3 and idx[2].item() == 0


def test_greedy_sampler_fast_path_gives_the_general_paths_tokens_and_errors():
    """The sampler's one-read greedy path (all greedy, nothing to apply, every row finite) and its general path
    agree; a NaN row still fails alone with its error."""
    from deployctl_runtime.request import Request
    from deployctl_runtime.sampler import Sampler

    sampler = Sampler(torch.device("cpu"))
    reqs = [Request(str(i), [1, 2, 3], SamplingParams(temperature=0, max_tokens=4, logprobs=2)) for i in range(4)]
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(1))
    fast = sampler(logits, reqs)
    with cpu_kernels.disabled():
        general = sampler(logits, reqs)
    assert [tuple(s) for s in fast] == [tuple(s) for s in general]
    assert [s.token_id for s in fast] == logits.argmax(-1).tolist()
    logits[2, 7] = float("nan")
    out = sampler(logits, reqs)
    assert out[2].error and not any(s.error for i, s in enumerate(out) if i != 2)
    assert [out[i].token_id for i in (0, 1, 3)] == [fast[i].token_id for i in (0, 1, 3)]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 vector widths")
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx",)])
def test_every_vector_width_of_the_decode_kernel(tmp_path, flags):
    """The head-size-64/128 kernel is written for vectors of 16, 8 or 4 floats (AVX-512, AVX, SSE/NEON); this machine
    builds the widest it has, so the narrower ones are built here on purpose and checked the same way."""
    narrow = cpu_kernels.CPUOps(ctypes.CDLL(str(cpu_kernels.build(cpu_kernels._compiler(), tmp_path, flags))))
    for num_heads, num_kv_heads, head_dim, lens in ((8, 2, 64, [1, 17, 40, 33, 130]), (12, 4, 128, [5, 70])):
        g = torch.Generator().manual_seed(head_dim)
        width = max(-(-n // 16) for n in lens)
        tables = (torch.arange(len(lens) * width).view(len(lens), width) * 3 % 97 + 1).int()
        kv = torch.randn(2, num_kv_heads, 100 * 16, head_dim, generator=g)
        q = torch.randn(len(lens), num_heads, head_dim, generator=g)
        want = _reference(q, kv[0], kv[1], tables.tolist(), lens, 16, head_dim ** -0.5)
        got = narrow.paged_decode(q, kv[0], kv[1], tables, torch.tensor(lens, dtype=torch.int32), head_dim ** -0.5, 16)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_an_unwritable_cache_builds_in_the_users_temp_folder(tmp_path, monkeypatch):
    """A cache folder that cannot be made (here: under a regular file, which stops root too) falls back to
    $TMPDIR/deployctl-runtime-UID instead of the slower torch path."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DEPLOYCTL_RUNTIME_CACHE", str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr(cpu_kernels.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    try:
        cpu_kernels.load.cache_clear()
        assert cpu_kernels.load() is not None
        assert list((tmp_path / "tmp" / f"deployctl-runtime-{os.getuid()}").glob("cpu_ops-*.so"))
    finally:
        cpu_kernels.load.cache_clear()


def _libgomp_settings(env_extra: dict, runtime_env: dict) -> str:
    """What torch's libgomp reports about itself (OMP_DISPLAY_ENV=VERBOSE, printed when it starts) in a process that
    imports the runtime the way `python -m deployctl_runtime serve` does: the package first, torch after."""
    env = {k: v for k, v in runtime_env.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_extra, OMP_DISPLAY_ENV="VERBOSE")
    out = subprocess.run([sys.executable, "-c", "import deployctl_runtime, torch; torch.ones(4).sum()"], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stderr


def test_openmp_threads_sleep_when_idle_unless_the_operator_says_otherwise(runtime_env):
    """libgomp's default spins 300,000 times before a worker sleeps: beside a co-tenant on the host's cores every
    parallel region then waits for a descheduled spinner (bench_engine --cotenant 1: 0.73x transformers with the
    default, 1.71x with PASSIVE). The runtime asks for PASSIVE (spin count 0); an operator's own value is kept."""
    ours = _libgomp_settings({}, runtime_env)
    assert "GOMP_SPINCOUNT = '0'" in ours, ours
    theirs = _libgomp_settings({"OMP_WAIT_POLICY": "ACTIVE"}, runtime_env)
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in theirs and "GOMP_SPINCOUNT = '0'" not in theirs, theirs
