"""benchmarks/corpus_scale.py without Snakemake: reading the pipeline's files, and the goals."""

import json

import pytest

from benchmarks import corpus_scale


# --------------------------------------------------------------------------------------------- the pipeline's files


def test_the_config_is_the_briefed_override_of_the_default(tmp_path):
    config = corpus_scale.pipeline_config(tmp_path / "c.txt", tmp_path / "0.3gb", cores=4, processes=2)
    assert config == {
        "output_root": str(tmp_path / "0.3gb"),
        "data": {"corpus": str(tmp_path / "c.txt")},
        "teacher": {"pretrain": {"max_steps": 10}},
        "distill_pretrain": {"train": {"max_steps": 10, "log_every": 5}},
        "compute": {"data_threads": 4, "processes": 2},
    }


@pytest.mark.parametrize("arguments, stage", [
    (["/venv/bin/python", "-m", "pipeline", "tokenize-corpus", "--workers", "2"], "tokenize-corpus"),
    (["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pipeline",
      "distill-pretrain", "--config-json", "{}"], "distill-pretrain"),
    (["python", "-u", "-m", "pipeline", "distill-pretrain", "--out-dir", "x"], "distill-pretrain"),
    (["/bin/bash", "-c", "python -m pipeline tokenizer"], None),  # Snakemake's shell: not a stage process
])
def test_stage_of_command(arguments, stage):
    assert corpus_scale.stage_of_command(arguments) == stage


def write_size_outputs(root, max_rss=500.0, first_step=8.0, processes=1):
    """The files the pipeline writes that collect() reads, with hand-made numbers."""
    (root / "benchmarks").mkdir(parents=True)
    for rule in corpus_scale.RULES:
        (root / "benchmarks" / f"{rule}.tsv").write_text(
            "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
            f"12.5\t0:00:12\t{max_rss}\t900.0\t400.0\t420.0\t1.0\t2.0\t95.0\t11.9\n")
    (root / "corpus").mkdir()
    (root / "corpus" / "metrics.json").write_text(json.dumps({
        "n_tokens": 1234, "n_documents": 10, "text_megabytes": 5.0, "tokenize_seconds": 2.0,
        "tokenize_mb_per_second": 2.5, "workers": 2, "peak_rss_mib": {"self": 300.0, "largest_child": 350.0}}))
    for path in corpus_scale.TRAINING_METRICS.values():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(json.dumps({"first_step_seconds": first_step, "peak_memory_mib": 700.0,
                                             "processes": processes}))


def test_collect_reads_the_tsvs_and_metrics_and_takes_the_largest_process(tmp_path):
    write_size_outputs(tmp_path)
    peaks = {"tokenize_corpus": {"main": 280.0, "child": 360.0}, "tokenizer": {"main": 410.0}}
    result = corpus_scale.collect(tmp_path, {"path": "c.txt", "bytes": 5_000_000, "lines": 99}, peaks)

    assert result["n_tokens"] == 1234 and result["corpus"]["bytes"] == 5_000_000
    assert result["tokenize"]["tokenize_mb_per_second"] == 2.5
    assert result["first_step_seconds"] == {"teacher_pretrain": 8.0, "distill_pretrain_main": 8.0}
    rules = result["rules"]
    assert rules["prepare_data"]["wall_seconds"] == 12.5 and rules["prepare_data"]["max_rss_mib"] == 500.0
    assert rules["tokenize_corpus"]["process_peaks_by_role_mib"] == {"main": 300.0, "child": 360.0}
    assert rules["tokenize_corpus"]["process_peak_rss_mib"] == 360.0
    assert rules["tokenizer"]["process_peak_rss_mib"] == 410.0
    assert rules["distill_pretrain_main"]["process_peak_rss_mib"] == 700.0
    assert rules["tokenizer"]["process_peak_exact"] and rules["tokenize_corpus"]["process_peak_exact"]
    # Not seen running: Snakemake's sampled figure stands in, and says so.
    assert rules["prepare_data"]["process_peak_rss_mib"] == 500.0
    assert not rules["prepare_data"]["process_peak_exact"]
    assert rules["prepare_data"]["process_peak_source"].startswith("snakemake max_rss")


def test_collect_takes_the_tree_sum_when_it_exceeds_the_peak_a_training_stage_reports(tmp_path):
    write_size_outputs(tmp_path, max_rss=900.0)  # evaluation after training grew the process past 700 MB
    rules = corpus_scale.collect(tmp_path, {})["rules"]
    assert rules["teacher_pretrain"]["process_peak_rss_mib"] == 900.0
    assert rules["tokenize_corpus"]["process_peak_rss_mib"] == 350.0  # three processes: their own figures


# --------------------------------------------------------------------------------------------- the goals


def size_result(size_gb, peak_mib=1000.0, tokenize_peak_mib=None, first_step=10.0, speed_vs_library=0.8):
    rules = {rule: {"process_peak_rss_mib": peak_mib, "process_peak_exact": True} for rule in corpus_scale.RULES}
    if tokenize_peak_mib is not None:
        rules["tokenize_corpus"]["process_peak_rss_mib"] = tokenize_peak_mib
    return {"size_gb": size_gb, "rules": rules, "tokenize_speed_vs_library": speed_vs_library,
            "first_step_seconds": {"teacher_pretrain": first_step, "distill_pretrain_main": first_step}}


def test_goals_pass_when_memory_and_first_step_stay_flat():
    sizes = [size_result(1.0, peak_mib=1100.0, first_step=14.0), size_result(0.3, peak_mib=1000.0, first_step=12.0)]
    distributed = {"processes": 2, "process_peaks_by_role_mib": {"launcher": 90.0, "rank0": 1200.0, "rank1": 1150.0},
                   "rule": {"max_rss_mib": 2500.0}}
    goals = corpus_scale.evaluate_goals(sizes, distributed)

    assert goals["all_passed"] is True
    assert goals["peak_rss_under_limit"]["size_gb"] == 1.0 and goals["peak_rss_under_limit"]["largest_mib"] == 1100.0
    assert goals["peak_rss_flat"]["largest_ratio"] == 1.1
    assert goals["first_step_flat"]["by_stage"]["teacher_pretrain"]["ratio"] == pytest.approx(14 / 12, abs=1e-3)
    assert goals["tokenize_vs_library"]["ratio_by_size_gb"] == {"0.3": 0.8, "1.0": 0.8}
    assert goals["distributed_ranks_under_limit"]["rank_peaks_mib"] == {"rank0": 1200.0, "rank1": 1150.0}


def test_a_first_step_within_five_seconds_passes_even_when_its_ratio_is_large():
    goals = corpus_scale.evaluate_goals([size_result(0.3, first_step=2.0), size_result(1.0, first_step=6.5)])
    assert goals["first_step_flat"]["by_stage"]["distill_pretrain_main"]["ratio"] == 3.25
    assert goals["first_step_flat"]["passed"] is True


def test_goals_fail_with_the_numbers_that_broke_them():
    sizes = [
        size_result(0.3, peak_mib=1000.0, first_step=10.0, speed_vs_library=0.7),
        size_result(1.0, peak_mib=1000.0, tokenize_peak_mib=3500.0, first_step=20.0, speed_vs_library=0.3),
    ]
    distributed = {"processes": 2, "process_peaks_by_role_mib": {"rank0": 3200.0, "rank1": 1000.0}}
    goals = corpus_scale.evaluate_goals(sizes, distributed)

    assert goals["all_passed"] is False
    assert goals["peak_rss_under_limit"]["passed"] is False
    assert goals["peak_rss_under_limit"]["largest_rule"] == "tokenize_corpus"
    assert goals["peak_rss_flat"]["passed"] is False
    assert goals["peak_rss_flat"]["largest_ratio"] == 3.5
    assert goals["peak_rss_flat"]["largest_ratio_rule"] == "tokenize_corpus"
    assert goals["first_step_flat"]["passed"] is False  # twice as long and 10 s more
    assert goals["tokenize_vs_library"]["passed"] is False
    assert goals["distributed_ranks_under_limit"]["passed"] is False


def test_goals_the_runs_cannot_decide_are_left_open():
    one_size = [size_result(0.3)]
    rank0_only = {"processes": 2, "process_peaks_by_role_mib": {"rank0": 1000.0}}  # rank 1 was not seen
    goals = corpus_scale.evaluate_goals(one_size, rank0_only)

    assert goals["peak_rss_under_limit"]["passed"] is True
    assert goals["peak_rss_flat"]["passed"] is None and goals["first_step_flat"]["passed"] is None
    assert goals["distributed_ranks_under_limit"]["passed"] is None
    assert goals["all_passed"] is False


def test_sampled_memory_figures_fail_over_the_limit_but_cannot_pass():
    small, large = size_result(0.3), size_result(1.0, peak_mib=1100.0)
    large["rules"]["teacher_pretrain"]["process_peak_exact"] = False  # skipped under --reuse: Snakemake's sample
    goals = corpus_scale.evaluate_goals([small, large])
    assert goals["peak_rss_under_limit"]["passed"] is None
    assert goals["peak_rss_flat"]["passed"] is None
    assert goals["peak_rss_flat"]["rules_not_measured_exactly"] == ["teacher_pretrain"]

    large["rules"]["teacher_pretrain"]["process_peak_rss_mib"] = 3500.0  # a lower bound already over the limit
    assert corpus_scale.evaluate_goals([small, large])["peak_rss_under_limit"]["passed"] is False
