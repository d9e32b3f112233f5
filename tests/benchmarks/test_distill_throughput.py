"""benchmarks/distill_throughput/ on tiny models: the model FLOP count (by hand, and against torch's
FlopCounterMode on a forward and backward of the stage's real modules), the GEMM shapes of a step, the kernel
classes of a profile, and the JSON a tiny CPU run writes (its keys, the interleaved order of its repeats)."""

import json
import time

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForMaskedLM

from pipeline.data.mlm_batches import MaskedBatchCollator
from pipeline.distillation.chunked_lm_loss import ChunkLayout
from pipeline.plan.config import DistillPretrainConfig
from pipeline.stages.distill_pretrain import distillation_terms
from benchmarks.distill_throughput.cli import main
from benchmarks.distill_throughput.flops import EncoderShape, encoder_forward_flops, head_forward_flops, model_flops
from benchmarks.distill_throughput.gemm_ceiling import (matmul_operands, peak_tflops, step_matmul_shapes,
                                                        vocabulary_gemms)
from benchmarks.distill_throughput.kernels import KERNEL_CLASSES, kernel_class, profile_summary
from benchmarks.distill_throughput.sequences import EXECUTED_TOKENS_KEY, CountingCollate, real_sequence_lengths
from benchmarks.distill_throughput.telemetry import GpuTelemetry, _smi_number
from benchmarks.distill_throughput.workload import PHASES, BertTokenIds
from pipeline.distillation.students import freeze, init_student_from_teacher, student_config_from_teacher


# ------------------------------------------------------------------------------------------------ FLOP count


def test_model_flops_match_a_hand_count():
    # Student: 1 layer, H 4, I 8, V 10; teacher: the same with 2 layers; sequences of 3 and 5 real tokens, every
    # token a head row (R = N = 8).
    student = EncoderShape(layers=1, hidden=4, intermediate=8, heads=2, vocab=10)
    teacher = EncoderShape(layers=2, hidden=4, intermediate=8, heads=2, vocab=10)
    flops = model_flops(teacher, student, [3, 5], head_rows=8)

    linear_per_layer = 8 * 2 * (4 * 4 * 4 + 2 * 4 * 8)  # N x 2 x (Q, K, V, out: 4 H^2 + FFN: 2 H I) = 2,048
    attention_per_layer = 4 * 4 * (3 * 3 + 5 * 5)  # 4 H sum L^2 = 544
    head = 2 * 8 * (4 * 4 + 4 * 10)  # 2 R (H^2 + H V) = 896
    student_forward = linear_per_layer + attention_per_layer + head  # 3,488
    teacher_forward = 2 * (linear_per_layer + attention_per_layer) + head  # 6,080
    assert flops["student_forward"] == student_forward == 3488
    assert flops["teacher_forward"] == teacher_forward == 6080
    assert flops["student_backward"] == 2 * 3488
    assert flops["total"] == 6080 + 3 * 3488 == 16544
    assert flops["attention"] == 2 * 544 + 3 * 544
    assert flops["vocab_projection"] == 2 * 8 * 4 * 10 * (1 + 3)


def tiny_teacher_and_student():
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=2, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                        max_position_embeddings=64)
    teacher = BertForMaskedLM(config)
    student = init_student_from_teacher(teacher, student_config_from_teacher(config, 1), [0])
    return freeze(teacher), student


def masked_batch(sequence_lengths, packed_multiple):
    rng = np.random.default_rng(0)
    sequences = [rng.integers(1000, 30522, size=n - 2) for n in sequence_lengths]  # n real tokens with [CLS] [SEP]
    collator = CountingCollate(MaskedBatchCollator(BertTokenIds(), 0.3, None, packed_multiple), False)
    return collator(sequences, torch.Generator().manual_seed(0))


def executed_flops(teacher, student, n_tokens, attention_lengths, head_rows):
    """FLOPs of the matmuls that run, padding included: what FlopCounterMode sees."""
    teacher_forward = sum(encoder_forward_flops(teacher, n_tokens, attention_lengths).values()) + sum(
        head_forward_flops(teacher, head_rows).values())
    student_forward = sum(encoder_forward_flops(student, n_tokens, attention_lengths).values()) + sum(
        head_forward_flops(student, head_rows).values())
    return teacher_forward + 3 * student_forward


def counted_by_torch(teacher, student, batch, cfg, layout):
    """FlopCounterMode's count of the stage's loss, forward and backward. SDPA is pinned to its math backend:
    its matmuls are counted as they run, where the fused kernels would be counted by formula (flash and
    memory-efficient attention's backward as 5 products, recomputing the scores; the CPU flash kernel not at all)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        terms = distillation_terms(student, teacher, batch, cfg, layout=layout)
        terms["loss"].backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("chunk_rows, restrict", [(12, False), (36, False), (1, True)])
def test_model_flops_equal_torchs_count_when_nothing_is_padding(chunk_rows, restrict):
    # Tolerance 0: both count 2 m n k per matmul and nothing else (softmax, LayerNorm, GELU and the losses'
    # elementwise work count 0 in both); with equal lengths, a packed multiple that adds no token, chunks that
    # divide the rows and the vocabulary left unpadded, every executed FLOP is a model FLOP.
    teacher, student = tiny_teacher_and_student()
    batch = masked_batch([12, 12, 12], packed_multiple=4)
    cfg = DistillPretrainConfig(restrict_ce_to_mask=restrict)
    head_rows = len(batch["masked_positions"]) if restrict else 36
    assert real_sequence_lengths(batch) == (12, 12, 12)

    ours = model_flops(EncoderShape.of(teacher.config), EncoderShape.of(student.config),
                       real_sequence_lengths(batch), head_rows)
    layout = ChunkLayout(chunk_rows, vocab_multiple=1)
    assert counted_by_torch(teacher, student, batch, cfg, layout) == ours["total"]


def test_torchs_count_exceeds_model_flops_by_exactly_the_padding():
    # Sequences of 5, 9 and 20 tokens: 34 real tokens rounded up to 40 (a padding sequence of 6), attended on CPU in
    # a grid of 4 sequences x the longest (20); the loss's 34 rows in chunks of 8 (eager: the last one short), its
    # vocabulary of 30,522 padded to 30,528. Model FLOPs count 34 tokens, 5^2 + 9^2 + 20^2 and 30,522 words; torch
    # counts what ran.
    teacher, student = tiny_teacher_and_student()
    batch = masked_batch([5, 9, 20], packed_multiple=8)
    teacher_shape, student_shape = EncoderShape.of(teacher.config), EncoderShape.of(student.config)
    assert real_sequence_lengths(batch) == (5, 9, 20)
    assert batch[EXECUTED_TOKENS_KEY] == 40
    grid = [batch["max_seqlen"]] * (len(batch["cu_seqlens"]) - 1)
    assert grid == [20, 20, 20, 20]

    def executed_forward(shape):
        hidden = shape.hidden
        encoder = sum(encoder_forward_flops(shape, 40, grid).values())
        return encoder + 2 * 34 * hidden * hidden + 2 * 34 * hidden * 30528  # head transform; padded projection

    expected = executed_forward(teacher_shape) + 3 * executed_forward(student_shape)
    counted = counted_by_torch(teacher, student, batch, DistillPretrainConfig(), ChunkLayout(8))
    model = model_flops(teacher_shape, student_shape, (5, 9, 20), 34)["total"]
    assert counted == expected
    assert counted > model


def test_the_step_matmul_shapes_hold_the_model_flops_apart_from_attention():
    teacher = EncoderShape(layers=2, hidden=8, intermediate=16, heads=2, vocab=50)
    student = EncoderShape(layers=1, hidden=8, intermediate=16, heads=2, vocab=50)
    flops = model_flops(teacher, student, [6, 4], head_rows=10)
    for chunk_rows, padded in ((1, True), (5, True), (10, True), (4, False), (64, False)):
        # Chunks that divide the rows, or eager chunks with a short tail, on the unpadded vocabulary: no padding.
        shapes = step_matmul_shapes(teacher, student, encoder_rows=10, head_rows=10, chunk_rows=chunk_rows,
                                    padded_chunks=padded)
        matmul_flops = sum(2 * s["m"] * s["n"] * s["k"] * s["count"] for s in shapes)
        assert matmul_flops == flops["total"] - flops["attention"], chunk_rows
    # 10 rows in chunks of 4, compiled: three chunks of one shape (the last padded), the vocabulary padded to 64.
    chunked = step_matmul_shapes(teacher, student, 10, 10, chunk_rows=4, vocab_multiple=64)
    assert {"m": 4, "n": 64, "k": 8, "layout": "nt", "count": 2 * 3} in chunked  # teacher's and student's logits
    assert {"m": 4, "n": 8, "k": 64, "layout": "nn", "count": 3} in chunked  # the student's input gradient
    assert {"m": 64, "n": 8, "k": 4, "layout": "tn", "count": 3} in chunked  # its weight gradient, gᵀ a view
    assert not any(s["n"] == 50 or s["m"] == 50 or s["k"] == 50 for s in chunked)
    # Eager: two chunks of 4 and a tail of 2, no padding rows.
    eager = step_matmul_shapes(teacher, student, 10, 10, chunk_rows=4, vocab_multiple=64, padded_chunks=False)
    assert {"m": 4, "n": 64, "k": 8, "layout": "nt", "count": 2 * 2} in eager
    assert {"m": 2, "n": 64, "k": 8, "layout": "nt", "count": 2} in eager


@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_the_gemm_operands_have_the_steps_layouts(layout):
    a, b = matmul_operands(3, 5, 4, layout, torch.float32, torch.device("cpu"))
    assert a.shape == (3, 4) and b.shape == (4, 5)
    assert a.is_contiguous() == (layout[0] == "n") and b.is_contiguous() == (layout[1] == "n")


def test_the_vocabulary_gemms_are_timed_at_every_size_in_the_losss_layouts():
    results = vocabulary_gemms(16, 8, [30522, 30528], torch.float32, torch.device("cpu"), 0.001)
    assert [(r["vocab"], r["gemm"]) for r in results] == [
        (vocab, name) for vocab in (30522, 30528) for name in ("logits", "input_gradient", "weight_gradient")]
    weight_gradient = results[2]
    assert (weight_gradient["m"], weight_gradient["n"], weight_gradient["k"]) == (30522, 8, 16)
    assert weight_gradient["layout"] == "tn" and all(r["tflops"] > 0 for r in results)


# ------------------------------------------------------------------------------------------------ kernel classes


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     "gemm"),
    ("nvjet_tst_192x192_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, float, 128, 16, 4, 4, false, false>", "gemm"),
    ("aten::addmm", "gemm"),
    ("aten::mm", "gemm"),
    ("aten::bmm", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>", "attention"),
    ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::scaled_dot_product_attention", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>", "softmax_loss"),
    ("aten::_log_softmax", "softmax_loss"),
    ("aten::kl_div", "softmax_loss"),
    ("triton_red_fused__log_softmax_1", "softmax_loss"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "elementwise"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "elementwise"),
    ("triton_poi_fused_add_native_layer_norm_0", "elementwise"),
    ("aten::native_layer_norm", "elementwise"),
    ("aten::add_", "elementwise"),
    ("aten::gelu_backward", "elementwise"),
    ("aten::index_select", "elementwise"),
    ("Memcpy HtoD (Pinned -> Device)", "other"),
    ("Memset (Device)", "other"),
    ("aten::view", "other"),
    ("aten::empty", "other"),
    ("autograd::engine::evaluate_function: AddmmBackward0", "other"),
    ("cudaLaunchKernel", "other"),
])
def test_kernel_class_by_name(name, kind):
    assert kernel_class(name) == kind


def test_a_gpu_profile_sums_device_time_by_class_and_leaves_the_rest_to_idle_other():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(key, microseconds, device=DeviceType.CUDA, annotation=False):
        return SimpleNamespace(key=key, self_device_time_total=microseconds, self_cpu_time_total=microseconds,
                               device_type=device, is_user_annotation=annotation, count=1)

    events = [event("nvjet_tst_192x192_64x4_1x2_h_bz_coopA_NNT", 3000), event("flash_fwd_kernel", 1000),
              event("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4>", 500),
              event("void at::native::vectorized_elementwise_kernel<4>", 1000), event("Memcpy HtoD", 200),
              event("aten::addmm", 9000, device=DeviceType.CPU),  # host time: not on the device's timeline
              event("ProfilerStep#1", 10000, annotation=True)]
    summary = profile_summary(events, wall_seconds=0.010, on_gpu=True)
    assert summary["seconds_by_class"] == {"gemm": 0.003, "attention": 0.001, "softmax_loss": 0.0005,
                                           "elementwise": 0.001, "idle_other": 0.0045}
    assert summary["share_by_class"]["idle_other"] == 0.45 and summary["other_ops_seconds"] == 0.0002
    assert summary["top_by_class"]["idle_other"] == [{"name": "Memcpy HtoD", "seconds": 0.0002, "calls": 1}]


def test_gpu_telemetry_summarises_what_it_read_during_the_span():
    readings = iter([{"sm_clock_mhz": 1980.0, "power_w": 650.0}, {"sm_clock_mhz": 1755.0, "power_w": 700.0}])
    telemetry = GpuTelemetry(lambda: next(readings), interval=0.01)
    telemetry.start()
    deadline = time.monotonic() + 5
    while len(telemetry.samples) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    summary = telemetry.stop()
    assert summary["samples"] == 2  # the third read fails (StopIteration) and only loses its sample
    assert summary["sm_clock_mhz"] == {"mean": 1867.5, "min": 1755.0, "max": 1980.0}
    assert summary["power_w"]["max"] == 700.0 and summary["temperature_c"] is None
    assert _smi_number("[N/A]") is None and _smi_number("1980") == 1980.0
    assert GpuTelemetry(None, 0.01).stop() is None  # nothing to read (CPU): no summary


def test_peak_is_known_for_the_lent_gpus_and_null_on_cpu():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16")["tflops"] == 989.4
    assert peak_tflops("NVIDIA H200", "bf16")["tflops"] == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bf16")["tflops"] == 756.5
    assert peak_tflops("NVIDIA H200", "fp32")["tflops"] == 66.9
    assert peak_tflops("NVIDIA H100 NVL", "bf16")["tflops"] is None
    assert peak_tflops("Tesla T4", "bf16")["reason"] == "no peak on record for 'Tesla T4'"
    assert peak_tflops(None, "fp32")["tflops"] is None


# ------------------------------------------------------------------------------------------------ a tiny run


TINY = ["--device", "cpu", "--workers", "0", "--teacher-layers", "2", "--student-layers", "1",
        "--hidden", "16", "--intermediate", "32", "--heads", "2", "--seq-len", "32", "--max-tokens", "128",
        "--chunked-loss-rows", "24", "--packed-multiple", "16", "--warmup", "1", "--steps", "2", "--repeats", "2",
        "--profile-steps", "1", "--gemm-min-seconds", "0.001"]

# The fields the committed CPU result (benchmarks/results/distill_throughput_cpu.json) has always had.
KEPT_FIELDS = {"benchmark", "device", "cpu", "platform", "threads", "loader_workers", "torch", "bf16", "torch_compile",
               "seq_len", "max_tokens_per_batch", "corpus", "steps_timed", "seconds_per_step", "tokens_per_second",
               "step_breakdown_seconds", "peak_memory_mib", "teacher_parameters", "student_parameters",
               "last_loss_terms", "reference"}
NEW_FIELDS = {"command", "cores", "host_load_average_1min", "gpu", "precision", "tf32_matmul", "packed_tokens_multiple_of",
              "chunked_loss_rows", "loss_path", "model_shapes",
              "steps_warmup", "repeats", "protocol", "order", "mfu", "flop_formula", "peak", "gemm", "loops",
              "gpu_clocks", "profile"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput") / "result.json"
    result = main([*TINY, "--out", str(out)])
    return result, json.loads(out.read_text())


def test_the_json_has_the_kept_and_the_new_fields(tiny_run):
    result, written = tiny_run
    assert written == json.loads(json.dumps(result))
    assert KEPT_FIELDS | NEW_FIELDS <= set(written)
    assert written["cpu"]["model_name"] and written["device"] == "cpu" and written["gpu"] is None
    assert set(written["step_breakdown_seconds"]) == set(PHASES)
    assert set(written["flop_formula"]) >= {"mfu", "micro_batch", "model_forward", "symbols", "counted", "not_counted"}
    assert written["packed_tokens_multiple_of"] == 16 and written["chunked_loss_rows"] == 24 and written["seq_len"] == 32
    assert written["loss_path"]["name"] == "fused" and written["loss_path"]["vocab_multiple"] == 64
    assert written["loss_path"]["chunk_compiled"] is False  # eager on CPU
    assert all(s["layout"] in ("nn", "nt", "tn") for s in written["gemm"]["shapes"])
    assert written["protocol"]["meets_minimum"] is False  # 2 repeats of 2 steps: a smoke run
    assert written["model_shapes"]["student"] == {"layers": 1, "hidden": 16, "intermediate": 32, "heads": 2,
                                                  "vocab": 30522}


def test_repeats_are_interleaved_and_their_order_recorded(tiny_run):
    written = tiny_run[1]
    rounds = [(entry["loop"], entry["repeat"]) for entry in written["order"]]
    assert rounds == [(loop, repeat) for repeat in range(2) for loop in ("benchmark_loop", "stage_train", "gemm")]
    positions = {(entry["loop"], entry["repeat"]): entry["position"] for entry in written["order"]}
    for name in ("benchmark_loop", "stage_train"):
        repeats = written["loops"][name]["repeats"]
        assert [(name, r["repeat"]) for r in repeats] == [(name, 0), (name, 1)]
        assert all(r["position"] == positions[(name, r["repeat"])] for r in repeats)
    assert [r["position"] for r in written["gemm"]["repeats"]] == [positions[("gemm", 0)], positions[("gemm", 1)]]


def test_both_loops_count_the_same_batches_and_report_a_spread(tiny_run):
    written = tiny_run[1]
    bench_loop, stage = written["loops"]["benchmark_loop"], written["loops"]["stage_train"]
    for ours, theirs in zip(bench_loop["repeats"], stage["repeats"]):
        assert ours["tokens"] == theirs["tokens"] > 0
        assert ours["model_flops"] == theirs["model_flops"]
        assert ours["model_flops"]["total"] == ours["model_flops"]["teacher_forward"] + 3 * ours["model_flops"][
            "student_forward"]
        assert ours["achieved_tflops"] > 0 and ours["fraction_of_gemm_ceiling"] > 0
        assert ours["mfu"] is None and ours["gpu_telemetry"] is None
    assert [r["train_result"]["steps"] for r in stage["repeats"]] == [3, 3]
    for loop in (bench_loop, stage):
        summary = loop["summary"]["tokens_per_second"]
        assert len(summary["values"]) == 2 and summary["min"] <= summary["mean"] <= summary["max"]
        assert len(summary["ci95"]) == 2
        assert loop["summary"]["mfu"] is None  # no peak on CPU
    assert written["tokens_per_second"] == pytest.approx(np.mean([r["tokens_per_second"] for r in bench_loop["repeats"]]),
                                                         abs=0.1)


def test_cpu_runs_report_no_peak_mfu_or_gpu_clocks_with_the_reason(tiny_run):
    written = tiny_run[1]
    assert written["peak"]["tflops"] is None and "CPU" in written["peak"]["reason"]
    assert written["mfu"]["benchmark_loop"] is None and written["mfu"]["reason"] == written["peak"]["reason"]
    assert written["gpu_clocks"] == {"available": False, "reason": "device is cpu: no GPU clocks or power to read"}
    gemm = written["gemm"]
    assert gemm["dtype"] == "float32" and gemm["peak_tflops"] is None
    assert gemm["achieved_tflops"]["mean"] > 0 and len(gemm["repeats"]) == 2
    assert all(len(r["tflops_by_shape"]) == len(gemm["shapes"]) for r in gemm["repeats"])


def test_the_profile_splits_its_wall_time_into_the_kernel_classes(tiny_run):
    profile = tiny_run[1]["profile"]
    seconds = profile["seconds_by_class"]
    assert list(seconds) == list(KERNEL_CLASSES)
    assert seconds["gemm"] > 0 and seconds["elementwise"] > 0
    assert sum(seconds.values()) >= profile["wall_seconds"] - 1e-5  # idle_other takes what the others leave
    assert "aten::addmm" in {entry["name"] for entry in profile["top_by_class"]["gemm"]}
