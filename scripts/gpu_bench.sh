#!/usr/bin/env bash
# Issue 18's GPU checks on one bare GPU machine: install what it lacks, then run a named scenario.
#
#   scripts/gpu_bench.sh wheels            # on a machine WITH a registry: fetch the wheels into .whl/ (~24 MB)
#   scripts/gpu_bench.sh data              # here too: the distillation's utility labels and the polyview models'
#                                          # configs and tokenizers (no weights) into .gpu-data/ (~13 MB)
#   scripts/gpu_bench.sh SCENARIO[,SCENARIO...] [OUT]   # on the GPU machine; OUT defaults to outputs/gpu
#
# Scenarios (each writes OUT/<scenario>*.json and prints its table):
#   zero3-1b      full fine-tuning of llama3.2-1b-shape (Llama-3.2-1B's shape, random weights), bf16, seq 2048
#                 (packed), batch 8, DeepSpeed ZeRO-3 on one GPU: ours against TRL's SFTTrainer (tokens/s, MFU,
#                 peak GPU memory)
#   single-1b     the same without ZeRO (Lightning's single device; TRL's plain Trainer): what ZeRO-3 costs
#   bf16-vs-fp32  SFT of smollm2-135m-shape (full fine-tuning, lr 1e-3) for five steps in fp32 on the CPU and in
#                 bf16 on the GPU: the five losses must agree within 2%
#   all           the three above, in that order (a failed one does not stop the next; the exit code says)
#   fused-1b      single-1b then zero3-1b with Liger's RMSNorm, SwiGLU and rotary kernels on both sides (ours:
#                 model.fused_kernels; TRL: use_liger_kernel), then TRL without them alone (single): the same
#                 session's baseline
#   distill-bge-m3  issue 16: utility distillation of bge-m3-shape (BGE-M3's architecture, random weights) in bf16
#                 with the paper preset's batch (16 queries x 50 passages), gradient checkpointing on both sides:
#                 ours against SentenceTransformerTrainer (samples/s, peak GPU memory); reads .gpu-data/utility
#   polyview      issue 16: omnimed-bench polyview on the GPU (15 candidates a query, every view), in fp32 and in
#                 bf16; the judges are SmolLM2-135M and the utility encoder all-MiniLM-L6-v2 with their own configs
#                 and tokenizers (carried in .gpu-data/models by `data`) and random weights made there: a judge's
#                 score is one forward pass, so the weights do not change the time
#   goals-1b      issue 18's two goals in one session: one GPU with Liger on both sides (MFU), ZeRO-3 with Liger on
#                 both sides, then TRL's ZeRO-3 step with its defaults alone (1.2x TRL)
#   rss-trace     our side's host memory at each step phase on the GPU (scripts/rss_trace.py): with and without the
#                 lean MLP, and under ZeRO-3
#
# The machine needs python3 with torch (CUDA), lightning and transformers' own dependencies. What the image lacks
# is installed from .whl/ (no registry there) into a private folder put on PYTHONPATH, or with pip where a
# registry answers. The repository itself runs from src/ (no install), so the same checkout is used as is.
set -uo pipefail
cd "$(dirname "$0")/.."

# pinned as pyproject.toml pins them; deepspeed and antlr4 publish source only and are built into wheels here
PACKAGES=(transformers==5.23.0 peft==0.21.2 trl==1.16.0 datasets==5.2.0 sentence-transformers==6.2.0
          dill==0.4.1 multiprocess==0.70.19
          omegaconf==2.3.1 hjson==3.1.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
          typing-inspection==0.4.5 pytz==2026.6 bm25s==0.3.16 PyStemmer==3.1.0 dateparser==1.5.0 tzlocal==5.4.5
          liger-kernel==0.8.5)
SOURCE_ONLY=(deepspeed==0.19.8 antlr4-python3-runtime==4.9.3)
PY=${PYTHON:-python3}

if [[ "${1:-}" == "wheels" ]]; then
  mkdir -p .whl
  platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
             --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
      -d .whl "${PACKAGES[@]}" || exit 1
  $PY -m pip wheel -q --no-deps -w .whl "${SOURCE_ONLY[@]}" || exit 1
  du -sh .whl
  exit 0
fi

if [[ "${1:-}" == "data" ]]; then  # the labels the bench would build, so the GPU machine needs no bm25s or world
  exec "$PY" - <<'EOF'
import shutil
from pathlib import Path
from omnimed.bench.distill import DistillBenchConfig, build_data
cfg = DistillBenchConfig(batch_size=16, window=50, steps=10, warmup=3, world_size="small")
root = Path(".gpu-data")
shutil.rmtree(root, ignore_errors=True)
path, data = build_data(cfg, root / "build")
(root / "utility").mkdir(parents=True)
for name in ("records.jsonl", "manifest.json"):
    shutil.copy(path / name, root / "utility" / name)
shutil.rmtree(root / "build")
print(root / "utility", data)
from omnimed.models.packaged import packaged_model_path
weights = shutil.ignore_patterns("*.safetensors", "*.bin", "*.gguf", "*.pt", "*.onnx", "onnx", "openvino",
                                 "omnimed_*.json")
for name in ("smollm2-135m", "minilm-l6"):  # what the models are, without what they know
    shutil.copytree(packaged_model_path(name), root / "models" / name, ignore=weights)
    print(root / "models" / name, sorted(p.name for p in (root / "models" / name).iterdir()))
EOF
fi

scenarios=${1:?usage: scripts/gpu_bench.sh wheels | data | zero3-1b | single-1b | bf16-vs-fp32 | all | fused-1b | head-1b | goals-1b | distill-bge-m3 | polyview | rss-trace [OUT]}
out=${2:-outputs/gpu}
mkdir -p "$out"
site=/tmp/omnimed-site
if $PY -c "import trl, deepspeed, datasets, omegaconf, bm25s, dateparser, liger_kernel" 2>/dev/null; then
  echo "trl, deepspeed, datasets, omegaconf, bm25s, dateparser and liger_kernel import already: nothing to install"
elif compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || exit 1
else
  $PY -m pip install -q --target "$site" "${PACKAGES[@]}" "${SOURCE_ONLY[@]}" || exit 1
fi
export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export OMNIMED_CACHE=${OMNIMED_CACHE:-/tmp/omnimed-cache} HF_HUB_OFFLINE=1 WANDB_MODE=disabled
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY - <<'EOF'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print({d: md.version(d) for d in ("transformers", "peft", "trl", "deepspeed", "lightning", "datasets", "pyarrow",
                                   "liger-kernel", "triton")})
EOF

bench() { $PY -m omnimed.cli.bench "$@"; }
big=(--model llama3.2-1b-shape --lora-r 0 --accelerator cuda --precision bf16-mixed --max-length 2048 --packing
     --batch-size 8 --steps 12 --warmup 3 --threads 8 --lr 1e-5 --micro-batch-tokens 0 --repeats 1 --profile-step 1)
status=0
run() {  # run NAME CMD...: time one scenario, keep going when it fails
  local name=$1; shift
  echo "=== $name ($(date -u +%T))"
  "$@" || { echo "=== $name FAILED (exit $?)"; status=1; }
}
distill_bge_m3() {
  $PY -m omnimed.cli.bench distill --model bge-m3-shape --accelerator cuda --precision bf16-mixed \
      --gradient-checkpointing --batch-size 16 --window 50 --max-length 256 --steps 10 --warmup 3 --threads 8 \
      --lr 1e-5 --data .gpu-data/utility --out "$out/distill-bge-m3.json" ${DISTILL_EXTRA:-}
}
polyview() {  # random weights for the carried configs (in /tmp), then the bench in fp32 and bf16
  $PY - <<'EOF' || return 1
import shutil
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
for name, cls in (("smollm2-135m", AutoModelForCausalLM), ("minilm-l6", AutoModel)):
    src, dst = Path(".gpu-data/models") / name, Path("/tmp/omnimed-models") / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    torch.manual_seed(0)
    cls.from_config(AutoConfig.from_pretrained(dst)).save_pretrained(dst)
    print(dst, sorted(p.name for p in dst.iterdir()))
EOF
  local args=(--relevance-judge /tmp/omnimed-models/smollm2-135m --supplement-judge /tmp/omnimed-models/smollm2-135m
              --utility-encoder /tmp/omnimed-models/minilm-l6 --device cuda --threads 8 --queries 20 --warmup 2
              --batch-size 16)
  bench polyview "${args[@]}" --out "$out/polyview-fp32.json" &&
  bench polyview "${args[@]}" --dtype bfloat16 --out "$out/polyview-bf16.json"
}
# zero3_1b / single_1b [NAME [ARGS...]]: the result goes to $out/NAME.json, ARGS and then TRAIN_EXTRA (more
# `omnimed-bench train` arguments; the last of a repeated one wins) after the scenario's own
zero3_1b() {
  bench train "${big[@]}" --strategy deepspeed_zero3 --out "$out/${1:-zero3-1b}.json" "${@:2}" ${TRAIN_EXTRA:-}
}
single_1b() { bench train "${big[@]}" --strategy single --out "$out/${1:-single-1b}.json" "${@:2}" ${TRAIN_EXTRA:-}; }
liger=(--fused-kernels --trl-liger)
bf16_vs_fp32() {
  local small=(--model smollm2-135m-shape --lora-r 0 --sides ours --steps 5 --warmup 0 --lr 1e-3 --batch-size 4
               --max-length 256 --repeats 1)
  bench train "${small[@]}" --accelerator cpu --precision 32-true --threads 16 --out "$out/fp32-cpu.json" &&
  bench train "${small[@]}" --accelerator cuda --precision bf16-mixed --threads 8 --out "$out/bf16-gpu.json" &&
  $PY scripts/compare_losses.py "$out/fp32-cpu.json" "$out/bf16-gpu.json" --rtol 0.02
}
for scenario in ${scenarios//,/ }; do
case $scenario in
  zero3-1b) run zero3-1b zero3_1b ;;
  distill-bge-m3) run distill-bge-m3 distill_bge_m3 ;;
  single-1b) run single-1b single_1b ;;
  bf16-vs-fp32) run bf16-vs-fp32 bf16_vs_fp32 ;;
  polyview) run polyview polyview ;;
  all) run zero3-1b zero3_1b; run bf16-vs-fp32 bf16_vs_fp32; run single-1b single_1b ;;
  fused-1b) run fused-single-1b single_1b fused-single-1b "${liger[@]}"
            run fused-zero3-1b zero3_1b fused-zero3-1b "${liger[@]}"
            run plain-trl-single-1b single_1b plain-trl-single-1b --sides trl ;;
  goals-1b) run goal-single-1b single_1b goal-single-1b "${liger[@]}"    # the 55% MFU goal
            run goal-zero3-1b zero3_1b goal-zero3-1b "${liger[@]}"      # 1.2x TRL: against TRL with Liger
            run plain-trl-zero3-1b zero3_1b plain-trl-zero3-1b --sides trl ;;  # ... and against TRL's defaults
  head-1b) run head-single-1b single_1b head-single-1b "${liger[@]}" --sides ours   # chunked LM head (default)
           run whole-head-single-1b single_1b whole-head-single-1b "${liger[@]}" --sides ours --head-chunk 0 ;;
  rss-trace) run rss-lean $PY scripts/rss_trace.py; run rss-plain $PY scripts/rss_trace.py --no-lean-mlp
             run rss-zero3 $PY scripts/rss_trace.py --strategy deepspeed_zero3 ;;
  *) echo "unknown scenario '$scenario': zero3-1b | single-1b | bf16-vs-fp32 | all | fused-1b | head-1b | goals-1b | distill-bge-m3" \
          "| polyview | rss-trace" >&2
     exit 2 ;;
esac
done
exit $status
