#!/usr/bin/env bash
# The prepared device check (issue 18): on a machine with an NVIDIA GPU, in under 10 minutes (each step has a
# timeout: tests 120 s, each bench 160 s, sleep/wake 150 s; a step that runs out is recorded as rc 124 and the script goes on),
#   1. the gpu-marked runtime tests (CUDA == CPU greedy tokens, CUDA graphs == eager, bf16 default, the Triton
#      paged decode kernel == the torch reference over random block tables, GQA ratios, head sizes 64/128,
#      contexts 1-4096);
#   2. bench/bench_engine.py on Qwen3-0.6B's shape in bf16 (random weights), nano-vllm's workload (256 requests,
#      in/out uniform 100-1024) at max_num_seqs 64 and 256, against transformers' continuous batching (the
#      generate_batch manager) on the same GPU: output tok/s, the ratio, decode step time at batch 1 and 256 and
#      its HBM floor ((weights + KV bytes read) / 4.8 TB/s);
#   3. bench/bench_sleep.py on Qwen3-0.6B's shape in bf16 (issue 25): POST /sleep's and /wake_up's engine work
#      (LLMEngine.sleep / wake_up) in seconds, greedy outputs equal after the wake, and the sleeper's GPU residue
#      (torch.cuda.mem_get_info against the baseline: the figure deployctl.engines.runtime's Sleep estimates);
# and writes every figure to one JSON file ($OUT/gpu_check.json, else bench/out/gpu_check.json).
# Needs python3 with torch, Triton, transformers and pytest (no FastAPI/uvicorn: it measures the engine).
#
#   bash bench/gpu_check.sh            # on the GPU machine
#   bash bench/gpu_check.sh --dry-run  # anywhere: the same steps on CPU with a tiny shape (checks the script)
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PY=${PYTHON:-python3}
DEST=${OUT:-bench/out}
mkdir -p "$DEST"
export PYTHONPATH="runtime${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)

# 1. tests (the runtime conftest only: the suite's root conftest needs the fleet fixtures' packages)
if [ $DRY = 1 ]; then
  TEST_ARGS=(--collect-only -q)
else
  TEST_ARGS=(-q -m gpu -x)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$DEST/gpu.txt" 2>&1
fi
timeout 120 "$PY" -m pytest "${TEST_ARGS[@]}" --confcutdir=tests/runtime -p no:cacheprovider \
  tests/runtime/test_engine_cuda.py tests/runtime/test_paged_attention_kernel.py 2>&1 | tee "$DEST/gpu_tests.log"
TESTS_RC=${PIPESTATUS[0]}

# 2. the engine against transformers' continuous batching
if [ $DRY = 1 ]; then
  BENCH=(--device cpu --dtype float32 --shape qwen3-tiny --workload nano-vllm --requests 6 --threads 2
         --decode-context 64)
  SEQS=(4 8); STEPS=1,8
else
  BENCH=(--device cuda --dtype bfloat16 --shape qwen3-0.6b --workload nano-vllm --gpu-memory-utilization 0.45)
  SEQS=(64 256); STEPS=1,256
fi
RCS=()
for s in "${SEQS[@]}"; do
  extra=()
  [ "$s" = "${SEQS[-1]}" ] && extra=(--decode-steps "$STEPS")
  timeout 160 "$PY" bench/bench_engine.py "${BENCH[@]}" --max-num-seqs "$s" --peers hf_cb "${extra[@]}" \
    --json-out "$DEST/bench_seqs$s.json" 2>&1 | tee "$DEST/bench_seqs$s.log" | grep -v "^  engine:"
  RCS+=("${PIPESTATUS[0]}")
done

# 3. sleep/wake of the engine (weights to pinned host memory and back, KV pool freed and re-allocated)
if [ $DRY = 1 ]; then
  SLEEP=(--device cpu --shape qwen3-tiny --rounds 1)
else
  SLEEP=(--device cuda --dtype bfloat16 --shape qwen3-0.6b --gpu-memory-utilization 0.4 --rounds 3)
fi
timeout 150 "$PY" bench/bench_sleep.py "${SLEEP[@]}" --json-out "$DEST/bench_sleep.json" 2>&1 | tee "$DEST/bench_sleep.log"
SLEEP_RC=${PIPESTATUS[0]}

# 4. one JSON with everything
"$PY" - "$DEST" "$TESTS_RC" "$(( $(date +%s) - START ))" "${SEQS[*]}" "${RCS[*]}" "$SLEEP_RC" <<'EOF'
import json, pathlib, sys
dest, tests_rc, elapsed, seqs, rcs, sleep_rc = sys.argv[1:]
dest = pathlib.Path(dest)
out = {"tests_rc": int(tests_rc), "elapsed_s": int(elapsed), "bench": {}}
gpu = dest / "gpu.txt"
if gpu.exists():
    out["gpu"] = gpu.read_text().strip()
log = (dest / "gpu_tests.log").read_text().strip().splitlines()
out["tests_summary"] = log[-1] if log else ""
for s, rc in zip(seqs.split(), rcs.split()):
    f = dest / f"bench_seqs{s}.json"
    out["bench"][f"max_num_seqs_{s}"] = dict(json.loads(f.read_text()) if f.exists() else {}, rc=int(rc))
f = dest / "bench_sleep.json"
out["sleep"] = {"results": json.loads(f.read_text()) if f.exists() else [], "rc": int(sleep_rc)}
(dest / "gpu_check.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
EOF
RC=$TESTS_RC
for r in "${RCS[@]}" "$SLEEP_RC"; do [ "$r" = 0 ] || RC=1; done
exit "$RC"
