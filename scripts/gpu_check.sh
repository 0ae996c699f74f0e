#!/usr/bin/env bash
# The GPU checks, one command each mode (docs/performance.md, "GPU check"):
#
#   scripts/gpu_check.sh                      # lean mode on CUDA: no Ray, no vLLM (the default)
#   scripts/gpu_check.sh --device cpu         # the same on CPU with a tiny shape (the test suite runs it)
#   scripts/gpu_check.sh --steps 2            # other arguments go to the mode's script
#   scripts/gpu_check.sh --mode ray-vllm      # trainer.backend=ray with rank-side vLLM (needs ray, vllm)
#
# lean (scripts/gpu_lean_check.py): a random Qwen2 of Qwen2.5-0.5B's shape built here (nothing
# downloaded, no network), the lean rollout and FSDP2 (NCCL, world size 1) in this one process,
# bf16, a few GRPO steps. ray-vllm (scripts/gpu_check.py): the same model through Ray ranks with
# vLLM engines. Both print tokens/s per stage, MFU against the measured bf16 matmul peak, peak
# memory and the max |log-prob gap| between rollout and trainer.
#
# Exit status: 0 every bound held; 1 a bound broke (FAILED lines say which) or the run raised;
# 77 skipped: what the mode needs is missing here (no CUDA device, no ray or vllm), nothing was
# checked; 2 bad arguments; 124 the 8-minute timeout.
#
# UNTESTED ON A GPU: no GPU has run either mode yet; the lean mode runs on CPU in the test suite
# (tests/test_gpu_check.py). The lean mode needs torch, transformers and this repository's
# dependencies (it imports reinforge from this checkout); meant for one H100/H200 (about 20 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=lean
if [[ "${1:-}" == "--mode" ]]; then
  mode="${2:?--mode needs lean or ray-vllm}"
  shift 2
fi
case "$mode" in
  lean) script=scripts/gpu_lean_check.py ;;
  ray-vllm) script=scripts/gpu_check.py ;;
  *) echo "gpu_check.sh: --mode $mode is not known; use lean or ray-vllm" >&2; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's reinforge, installed or not
exec timeout 480 "${PYTHON:-python}" "$script" "$@"
