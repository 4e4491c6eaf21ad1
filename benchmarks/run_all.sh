#!/usr/bin/env bash
# The runs behind benchmarks/results/ and docs/speed.md. Each writes bench.json, bench.txt, bench.png.
# THREADS defaults to 1: on the shared 2-core machine these were measured on (load average 5-10 from other
# jobs), two OpenMP threads spend their time waiting for each other at every barrier; on an idle machine use
# THREADS=2 (or the core count).
set -euo pipefail
cd "$(dirname "$0")/.."
V=".venv/bin/vitlab bench --threads ${THREADS:-1}"
R=benchmarks/results
# Inference targets: eager fp32/bf16 vs every peer, and our speed modes, ViT-B/16 and ViT-S/16.
$V --model ViT-B/16 --batch-sizes 8 1 --modes int8 fp16 compile --train-batch 0 --rounds 3 -o $R/vit-b16-infer
$V --model ViT-S/16 --batch-sizes 8 1 32 --modes int8 fp16 compile --train-batch 0 --rounds 3 -o $R/vit-s16-infer
# Training step (forward + backward + AdamW), fp32 and bf16 autocast, ViT-S/16 at 224 px, batch 32.
$V --model ViT-S/16 --batch-sizes 1 --peers --modes --train-batch 32 --train-peers timm --rounds 3 \
   -o $R/vit-s16-train
# Gradient checkpointing: memory and speed of a ViT-B/16 training step at batch 32 (fp32 only).
$V --model ViT-B/16 --batch-sizes 1 --dtypes fp32 --peers --modes --train-batch 32 --train-peers --rounds 2 \
   --warmup 1 -o $R/vit-b16-gradckpt
# Accuracy cost of each mode on the Fashion-MNIST test set.
[ "${SKIP_ACCURACY:-0}" = 1 ] || .venv/bin/python benchmarks/mode_accuracy.py --out $R/mode-accuracy.json
# Best mode for ViT-B/16 at batch 8 against timm's fp32 eager, interleaved in the same rounds.
$V --model ViT-B/16 --batch-sizes 8 --dtypes fp32 --peers timm --modes bf16 int8 --train-batch 0 --rounds 5 \
   -o $R/vit-b16-best-mode
# Profiles (torch.profiler tables) behind the targets that are out of reach.
.venv/bin/python benchmarks/profile_ops.py --threads "${THREADS:-1}" --out $R/profile.txt
# The eager targets again, ours vs timm only (more rounds, shorter run, taken when the load had dropped to ~5).
$V --model ViT-S/16 --batch-sizes 8 --peers timm --modes int8 --train-batch 0 --rounds 7 -o $R/vit-s16-b8-vs-timm
$V --model ViT-B/16 --batch-sizes 8 --peers timm --modes int8 --train-batch 0 --rounds 5 -o $R/vit-b16-b8-vs-timm
# The deployment runtimes (OpenVINO fp32/bf16/int8, ONNX Runtime fp32/int8) vs eager, with their accuracy cost.
$V --model ViT-B/16 --batch-sizes 8 1 --peers onnxruntime onnxruntime-int8 openvino openvino-int8 --modes int8 \
   --train-batch 0 --warmup 1 --rounds 3 --calib-images 32 --accuracy-images 32 --peak-size 1024 \
   -o $R/vit-b16-runtimes
# One Markdown table of everything: benchmarks/RESULTS.md
.venv/bin/python benchmarks/summarize.py
