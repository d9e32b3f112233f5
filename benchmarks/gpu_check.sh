#!/usr/bin/env bash
# One prepared run on one lent GPU (one H200: about 9 minutes): distill_pretrain's loss on the device it is built
# for, everything written under one results folder.
#
#   benchmarks/gpu_check.sh [RESULTS_DIR]            the device run (default benchmarks/results/gpu_check)
#   benchmarks/gpu_check.sh --dry-run RESULTS_DIR    the same steps on the CPU at tiny shapes (tests run this)
#
# Steps, each under its own time limit so one that hangs cannot eat the others' minutes; a step that fails or
# runs out of time is recorded and the next one still runs:
#   0. wheels: the device image's torch comes with transformers 5.x; this project pins transformers 4.57.6, with
#      huggingface-hub < 1.0 and tokenizers <= 0.23.0. Carried as wheels in $WHEELS (benchmarks/wheels by default,
#      ignored by git: fetch them before the device call with
#        python -m pip download --no-deps -d benchmarks/wheels transformers==4.57.6 'huggingface-hub<1.0' \
#          'tokenizers<=0.23.0'
#      about 16 MB, and carry the folder) and installed from there, offline and without their dependencies (the
#      image's transformers 5.x brought those), when the installed transformers is not 4.57.6.
#   1. versions.json: Python, torch, CUDA, transformers, the GPU and its driver.
#   2. gemm (loss_paths.py --parts gemm): the three vocabulary GEMMs at 30,522, 30,528 and 30,592 words.
#   3. cuda_equivalence.py: the stage's path against the reference in fp32 and bf16 on both micro-batches, attention
#      dropout, host syncs.
#   4. loss_paths.py --parts throughput,profile,convergence in one process (the encoders compile once): the padded,
#      fused path against the unpadded eager one, 3 interleaved rounds of 5 + 50 steps, a 3-step profile of each,
#      and 150 steps of the stage's training loop per path and seed (2 seeds) from one start.
# summary.json lists every step with its exit status, seconds and output files; each step's output is in
# <step>.log.
set -u

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then
    DRY_RUN=1
    shift
fi
OUT=${1:-benchmarks/results/gpu_check}
PYTHON=${PYTHON:-python}
WHEELS=${WHEELS:-benchmarks/wheels}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The benchmarks run as modules of the project (python -m benchmarks.<name>), from wherever this is called.
export PYTHONPATH="$(dirname "$HERE")${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
: > "$OUT/steps.tsv"

if [ "$DRY_RUN" = 1 ]; then
    DEVICE=(--device cpu)
    # A 2-layer, 32-wide teacher and a 1-layer student: every step's code path, in seconds.
    SHAPE=(--teacher-layers 2 --student-layers 1 --hidden 32 --intermediate 64 --heads 2 --seq-len 32
           --chunked-loss-rows 64 --packed-multiple 16)
    LIMIT_GEMM=120; LIMIT_EQUIVALENCE=180; LIMIT_PATHS=300
    GEMM_ARGS=(--vocabularies 30522,30528 --gemm-min-seconds 0.001)
    EQUIVALENCE_ARGS=(--max-tokens 256)
    PATHS_ARGS=(--max-tokens 128 --workers 0 --warmup 1 --steps 1 --rounds 1 --profile-steps 1
                --convergence-steps 2 --convergence-max-tokens 64)
else
    DEVICE=(--device cuda)
    SHAPE=()  # the paper's: bert-base teacher, 6-layer student, configs/paper.yaml's distill_pretrain
    LIMIT_GEMM=45; LIMIT_EQUIVALENCE=110; LIMIT_PATHS=330
    GEMM_ARGS=()
    EQUIVALENCE_ARGS=()
    PATHS_ARGS=(--compile --workers 6)
fi

# run_step NAME LIMIT_SECONDS COMMAND...: the command's output in NAME.log, its status and seconds in steps.tsv.
run_step() {
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    echo "== $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local status=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - started))" "$limit" >> "$OUT/steps.tsv"
    echo "   exit $status after $((SECONDS - started))s"
}

if [ "$DRY_RUN" = 0 ] && [ -d "$WHEELS" ]; then
    run_step wheels 60 bash -c "$PYTHON -c 'import transformers, sys; sys.exit(transformers.__version__ != \"4.57.6\")' \
        || $PYTHON -m pip install --no-index --no-deps --find-links '$WHEELS' 'transformers==4.57.6' \
           'huggingface-hub<1.0' 'tokenizers<=0.23.0'"
fi

run_step versions 30 "$PYTHON" - "$OUT/versions.json" <<'EOF'
import json, platform, subprocess, sys
import torch, transformers, tokenizers, huggingface_hub
record = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
          "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
          "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
          "huggingface_hub": huggingface_hub.__version__, "gpu": None, "driver": None}
if torch.cuda.is_available():
    record["gpu"] = torch.cuda.get_device_name(0)
    record["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    record["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                      capture_output=True, text=True).stdout.strip() or None
try:
    import triton
    record["triton"] = triton.__version__
except ImportError:
    record["triton"] = None
with open(sys.argv[1], "w") as handle:
    json.dump(record, handle, indent=2)
print(json.dumps(record))
EOF

run_step gemm "$LIMIT_GEMM" "$PYTHON" -m benchmarks.loss_paths "${DEVICE[@]}" "${SHAPE[@]}" --parts gemm \
    "${GEMM_ARGS[@]}" --out "$OUT/vocabulary_gemms.json"
run_step cuda_equivalence "$LIMIT_EQUIVALENCE" "$PYTHON" -m benchmarks.cuda_equivalence "${DEVICE[@]}" "${SHAPE[@]}" \
    --checks fp32,bf16,attention_dropout,host_syncs "${EQUIVALENCE_ARGS[@]}" --out "$OUT/cuda_equivalence.json"
run_step loss_paths "$LIMIT_PATHS" "$PYTHON" -m benchmarks.loss_paths "${DEVICE[@]}" "${SHAPE[@]}" \
    --parts throughput,profile,convergence "${PATHS_ARGS[@]}" --out "$OUT/loss_paths.json"

"$PYTHON" - "$OUT" "$DRY_RUN" <<'EOF'
import json, sys
from pathlib import Path
out, dry_run = Path(sys.argv[1]), sys.argv[2] == "1"
steps = []
for line in (out / "steps.tsv").read_text().splitlines():
    name, status, seconds, limit = line.split("\t")
    steps.append({"step": name, "exit_status": int(status), "seconds": int(seconds), "limit_seconds": int(limit),
                  "timed_out": int(status) in (124, 137), "log": f"{name}.log"})
summary = {"dry_run": dry_run, "steps": steps, "seconds": sum(s["seconds"] for s in steps),
           "passed": all(s["exit_status"] == 0 for s in steps),
           "files": sorted(p.name for p in out.iterdir() if p.suffix == ".json" and p.name != "summary.json")}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps({k: summary[k] for k in ("dry_run", "seconds", "passed")}))
sys.exit(0 if summary["passed"] else 1)
EOF
