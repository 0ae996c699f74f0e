#!/usr/bin/env bash
# One GPU validation of trainer.backend=ray with rank-side vLLM (issue 15): a random ~0.48B
# Qwen2 built from config (nothing downloaded), FSDP2 on NCCL in bf16, a few GRPO steps.
# Prints tokens/s per stage, MFU, peak GPU memory and the max |log-prob gap| between vLLM and the
# trainer; exits non-zero when a gap or a loss is out of bounds (see scripts/gpu_check.py).
#
# UNTESTED: written without a GPU; no run of it has been seen to pass. Needs one CUDA GPU with
# about 40 GB free and `pip install 'reinforge[vllm]' ray`. Meant to finish in under 8 minutes
# on one H100/H200 (the timeout below stops it at 8).
#
#   scripts/gpu_check.sh               # 4 GRPO steps
#   scripts/gpu_check.sh --steps 2     # arguments go to scripts/gpu_check.py
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 480 "${PYTHON:-python}" scripts/gpu_check.py "$@"
