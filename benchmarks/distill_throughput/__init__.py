"""Benchmark: pretraining-distillation throughput and model FLOPs utilisation (MFU), measured the same way every time
(not a test).

A bert-base-sized teacher (random weights: 12 layers, 768 wide, 30,522 tokens) distills into a 6-layer DistilBERT
student initialised from teacher layers 0, 2, 4, 7, 9, 11, with distill_pretrain's own loss (`distillation_terms`)
at the shape of `configs/paper.yaml`'s distill_pretrain (sequence length, micro-batch token budget, chunked loss
rows, the packed layout's token multiple; each can be scaled down by a flag), fed exactly as the stage feeds it:
sequences read from a memory-mapped tokenized corpus (a tokenize_corpus folder, or one written here of random ids in
the same layout), token-budget batches, masking (with the token-frequency smoothing) in the DataLoader's workers,
pinned memory.

The protocol, in rounds: each round runs, one after the other, (1) the benchmark's own loop (`--warmup` untimed
steps, then `--steps` timed ones, with the time of each phase), (2) the stage's own loop, `pipeline.training.loop.train`
called with the arguments `distill_pretrain.run` gives it (the same number of steps; the first timed micro-batch's
start and the loop's return bound the timed span), and (3) a GEMM microbenchmark of the step's own matmul shapes.
`--repeats` rounds interleave the three, so a machine that drifts (clocks, other work) drifts for all of them alike;
the JSON records the order. Both loops read the same batches (the same seed and batch plan), so with one
micro-batch a step (`--grad-accum-steps 1`, the default) their FLOPs and tokens agree exactly. Then a `torch.profiler` trace of `--profile-steps` steps of the benchmark's loop gives the
time per kernel class.

    CPU smoke run (a 4-layer, 256-wide teacher and a 2-layer student, paper settings scaled down; under 3 minutes
    on 2 shared cores):
      .venv/bin/python -m benchmarks.distill_throughput --device cpu --threads 2 --workers 0 --teacher-layers 4 \
        --student-layers 2 --hidden 256 --intermediate 1024 --heads 4 --seq-len 128 --max-tokens 512 \
        --chunked-loss-rows 256 --packed-multiple 64 --warmup 1 --steps 3 --repeats 3 --profile-steps 2 \
        --gemm-min-seconds 0.05 --out benchmarks/results/distill_throughput_cpu.json
    One GPU at the paper's shape (3 rounds of 3 + 50 steps by default):
      python -m benchmarks.distill_throughput --device cuda --workers 6 \
        --out benchmarks/results/distill_throughput_paper_cuda.json

What the JSON holds:
- tokens/s and s/step (means of the benchmark loop's repeats, the headline fields), and per loop every repeat's
  tokens/s, s/step, model FLOPs, achieved TFLOP/s, MFU and fraction of the GEMM ceiling, with the spread (values,
  mean, min, max, Student's t 95 % interval);
- MFU = model FLOPs of the timed steps / their wall time / the GPU's dense peak at the run's precision. Model FLOPs
  are counted from each micro-batch's real tokens and sequence lengths (`flop_formula` in the JSON writes the
  formula out); on CPU there is no peak on record, so MFU is null with the reason, and the fraction of the measured
  GEMM ceiling stands in;
- the GEMM ceiling: the step's exact matmul shapes and operand layouts (from the model configs and the median
  micro-batch's rows; a Linear's forward x·Wᵀ, input gradient g·W and weight gradient gᵀ·x, gᵀ a transposed view),
  each timed alone, as FLOP/s over the step's mix, beside the peak;
- GPU clocks, power, temperature and utilisation sampled during each timed span (pynvml when installed, else
  nvidia-smi; null with the reason on CPU);
- the profile: seconds and shares per kernel class (gemm, attention, softmax_loss, elementwise, idle_other), from
  the profiler's key_averages, classified by op or kernel name; idle_other is the profiled wall time the other
  four classes leave (device idle, host overhead, copies and unclassified ops).

Nothing synchronises the device inside the benchmark loop's timed span: tokens/s is taken over the whole span, and
on CUDA the phase breakdown is the device's time between CUDA events recorded at the phase boundaries
(`data_wait`: the device waiting for the batch and its copy), beside the host's time to issue each phase
(`host_breakdown_seconds`). On CPU both are wall time. `--precision bf16` (the stage's default on CUDA) trains under
bf16 autocast with a bf16 teacher; `no` is fp32 throughout (TF32 off, PyTorch's default). Under `--compile` the
first steps compile for each new shape: give them `--warmup` steps.
"""
