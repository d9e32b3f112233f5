"""Benchmark: the MLM data path at two corpus sizes, run through Snakemake as a user runs it (not a test).

Evidence for the "memory flat in the data's size" convention (docs/scale.md). For each requested size it
generates an English-like corpus file (pipeline/data/generated_corpus.py) (one document per line: paragraphs, headings and articles far longer than
512 tokens), runs prepare_data -> tokenizer -> tokenize_corpus -> teacher_pretrain -> init_student ->
distill_pretrain on it with 10 optimizer steps per training stage, and collects every rule's wall time and peak
memory (Snakemake's benchmark TSVs, the stages' metrics.json, and each process's kernel high-water mark read from
/proc while the rules run). Beside it, the `tokenizers` library's own `encode_batch` on every core gives the
tokenizing speed to compare with. On the largest size distill_pretrain runs once more as 2 DDP processes (gloo).
Writes one JSON with the goals evaluated, and prints a table.

    .venv/bin/python -m benchmarks.corpus_scale --sizes-gb 0.3 1.0            # the evidence
    .venv/bin/python -m benchmarks.corpus_scale --sizes-gb 0.005 0.01 --cores 2 --out /tmp/corpus_scale.json

Corpora and pipeline outputs go under --work-dir (default artifacts/corpus_scale, ignored by git). A corpus file
is reused when its size and seed match; each size's pipeline outputs are deleted first, so every rule runs under
the /proc watch (--reuse keeps them and lets Snakemake skip what is up to date; a skipped rule's peak is then
Snakemake's sampled figure, and the memory goals stay undecided). Sizes are decimal: 1 GB = 10^9 bytes; memory
is binary: MiB = 2^20 bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

from pipeline.data.generated_corpus import generate_corpus
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.machine import cpu_description, high_water_mark_mib
from pipeline.outputs.manifests import library_versions
from pipeline.startup import libraries_loaded

REPO_ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------ the pipeline

# Rules of the target distill_pretrain/main in DAG order, as named by their benchmark TSVs.
RULES = ["prepare_data", "tokenizer", "tokenize_corpus", "teacher_pretrain", "init_student_main",
         "distill_pretrain_main"]
# `python -m pipeline <stage>` -> its rule (the target builds the main variant only).
RULE_OF_STAGE = {"prepare-data": "prepare_data", "tokenizer": "tokenizer", "tokenize-corpus": "tokenize_corpus",
                 "teacher-pretrain": "teacher_pretrain", "init-student": "init_student_main",
                 "distill-pretrain": "distill_pretrain_main"}
TRAINING_METRICS = {"teacher_pretrain": "teacher_pretrain/metrics.json",
                    "distill_pretrain_main": "distill_pretrain/main/metrics.json"}
TRAIN_STEPS = 10
TARGET = "distill_pretrain/main"


def pipeline_config(corpus: str | Path, output_root: str | Path, cores: int, processes: int = 1) -> dict:
    """The config merged over configs/default.yaml: the generated corpus (SQuAD stays synthetic), 10 optimizer
    steps per training stage, and tokenize_corpus and the tokenizer trainer on every core."""
    return {
        "output_root": str(output_root),
        "data": {"corpus": str(corpus)},
        "teacher": {"pretrain": {"max_steps": TRAIN_STEPS}},
        "distill_pretrain": {"train": {"max_steps": TRAIN_STEPS, "log_every": 5}},
        "compute": {"data_threads": cores, "processes": processes},
    }


def snakemake_executable() -> str:
    """The snakemake of the environment running this script (the Snakefile runs stages with its interpreter)."""
    beside = Path(sys.executable).parent / "snakemake"
    return str(beside if beside.is_file() else REPO_ROOT / ".venv" / "bin" / "snakemake")


class PipelineFailed(RuntimeError):
    """Snakemake failed or ran past its time; carries its log and the process peaks seen until then."""

    def __init__(self, message: str, log: Path, process_peaks: dict):
        super().__init__(message)
        self.log, self.process_peaks = str(log), process_peaks


def run_pipeline(corpus: str | Path, output_root: str | Path, cores: int, processes: int = 1,
                 only_rule: str | None = None, timeout_seconds: float | None = None) -> dict:
    """`snakemake <output_root>/distill_pretrain/main --cores N --configfile <file>` from the repository root.
    With `only_rule`, that rule alone is forced to run (the others' outputs must exist). Returns the command,
    its wall time, the log of Snakemake's own output and every pipeline process's peak RSS. Raises
    PipelineFailed with the log's tail when Snakemake fails or runs past `timeout_seconds` (then its process
    group is stopped)."""
    output_root = Path(output_root).resolve()
    label = output_root.name + (f".processes{processes}" if processes > 1 else "")
    config_file = output_root.parent / f"{label}.config.yaml"
    log_file = output_root.parent / f"{label}.snakemake.log"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(pipeline_config(Path(corpus).resolve(), output_root, cores, processes)))
    # The target first: --forcerun and --allowed-rules take every word that follows them.
    command = [snakemake_executable(), str(output_root / TARGET), "--cores", str(cores),
               "--configfile", str(config_file), "--rerun-incomplete"]
    if only_rule:  # nothing else may run, though the changed compute section touches the other training rules
        command += ["--forcerun", only_rule, "--allowed-rules", only_rule]
    started = time.perf_counter()
    with log_file.open("w") as log, ProcessPeaks() as peaks:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # its own process group, to stop it whole
        peaks.watch(process.pid)
        try:
            returncode = process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            stop_process_group(process)
            returncode = None
    seconds = time.perf_counter() - started
    if returncode != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        what = f"did not finish in {timeout_seconds:.0f} s" if returncode is None else f"failed ({returncode})"
        raise PipelineFailed(f"snakemake {what}; log {log_file}, rule logs in {output_root}/logs:\n{tail}",
                             log_file, peaks.by_rule())
    return {"command": command, "config_file": str(config_file), "log": str(log_file),
            "seconds": round(seconds, 1), "process_peaks": peaks.by_rule()}


def stop_process_group(process: subprocess.Popen, grace_seconds: float = 60) -> None:
    """SIGTERM to Snakemake's process group (Snakemake then stops its jobs), SIGKILL after `grace_seconds`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class ProcessPeaks:
    """Polls the process tree under Snakemake and keeps each pipeline process's peak resident set (the kernel's
    VmHWM, which only grows) by rule and role: main, child (a forked tokenizing worker), launcher (torchrun),
    rank0, rank1, ... Linux only; elsewhere it records nothing."""

    INTERVAL_SECONDS = 0.2

    def __init__(self):
        self.peaks: dict[int, dict] = {}
        self._root: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ProcessPeaks:
        return self

    def watch(self, root_pid: int) -> None:
        self._root = root_pid
        self._thread.start()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _poll(self) -> None:
        import psutil  # a Snakemake dependency

        while not self._stop.wait(self.INTERVAL_SECONDS):
            try:
                children = psutil.Process(self._root).children(recursive=True)
            except psutil.Error:
                return
            for child in children:
                with contextlib.suppress(OSError, psutil.Error):
                    self._record(child.pid, child.ppid())

    def _record(self, pid: int, parent: int) -> None:
        known = self.peaks.get(pid)
        if known is None:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stage = stage_of_command([a.decode(errors="replace") for a in arguments])
            if stage is None:
                return  # the shell Snakemake starts, or anything else that is not a stage
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            rank = next((e[5:].decode() for e in environ if e.startswith(b"RANK=")), None)
            if rank is not None:
                role = f"rank{rank}"
            elif b"torch.distributed.run" in arguments:
                role = "launcher"
            else:
                role = "child" if parent in self.peaks else "main"
            known = self.peaks[pid] = {"rule": RULE_OF_STAGE.get(stage, stage), "role": role, "peak_rss_mib": 0.0}
        known["peak_rss_mib"] = max(known["peak_rss_mib"], high_water_mark_mib(pid) or 0.0)

    def by_rule(self) -> dict[str, dict[str, float]]:
        """{rule: {role: largest peak among its processes of that role, MiB}}."""
        result: dict[str, dict[str, float]] = {}
        for process in self.peaks.values():
            roles = result.setdefault(process["rule"], {})
            roles[process["role"]] = max(roles.get(process["role"], 0.0), round(process["peak_rss_mib"], 1))
        return result


def stage_of_command(arguments: list[str]) -> str | None:
    """The stage of a `python -m pipeline <stage> ...` command line (also under torchrun), else None."""
    for i, argument in enumerate(arguments[:-2]):
        if argument == "-m" and arguments[i + 1] == "pipeline":
            return arguments[i + 2]
    return None


# ------------------------------------------------------------------------------------------------ the baseline


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def corpus_line_batches(corpus: str | Path, sample_bytes: int, batch_lines: int) -> Iterator[list[str]]:
    """The corpus's first lines, up to `sample_bytes` of text, in batches of `batch_lines` (streamed)."""
    batch: list[str] = []
    read = 0
    with open(corpus, "rb") as lines:
        for line in lines:
            batch.append(line.decode("utf-8").rstrip("\n"))
            read += len(line)
            if len(batch) == batch_lines or read >= sample_bytes:
                yield batch
                batch = []
            if read >= sample_bytes:
                return
    if batch:
        yield batch


def library_tokenize_speed(corpus: str | Path, tokenizer_file: str | Path, threads: int,
                           sample_bytes: int = 100_000_000, batch_lines: int = 10_000) -> dict:
    """The tokenizers library alone on the same text: `Tokenizer.encode_batch` (its Rayon pool on `threads`
    cores) over the corpus's first `sample_bytes`; only the encode calls are timed. MB are 10^6 bytes of UTF-8."""
    # Rayon sizes its pool on first use in the process, from these variables.
    with environment(RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true"):
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        seconds = 0.0
        text_bytes = n_lines = n_tokens = 0
        for batch in corpus_line_batches(corpus, sample_bytes, batch_lines):
            started = time.perf_counter()
            encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
            seconds += time.perf_counter() - started
            text_bytes += sum(len(line.encode("utf-8")) for line in batch)
            n_lines += len(batch)
            n_tokens += sum(len(encoding.ids) for encoding in encodings)
    return {
        "text_megabytes": round(text_bytes / 1e6, 3), "lines": n_lines, "n_tokens": n_tokens,
        "encode_seconds": round(seconds, 3), "threads": threads, "batch_lines": batch_lines,
        "tokenize_mb_per_second": round(text_bytes / 1e6 / max(seconds, 1e-9), 3),
    }


# ------------------------------------------------------------------------------------------------ collecting


def read_benchmark_tsv(path: str | Path) -> dict | None:
    """Snakemake's benchmark row: wall seconds (`s`) and `max_rss` (MiB, the sum over the job's process tree)."""
    path = Path(path)
    if not path.is_file():
        return None
    with path.open() as tsv:
        row = next(csv.DictReader(tsv, delimiter="\t"), None)
    if row is None:
        return None

    def number(key: str) -> float | None:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            return float(row[key])
        return None

    return {"wall_seconds": number("s"), "max_rss_mib": number("max_rss"), "cpu_seconds": number("cpu_time")}


def read_metrics(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def collect(output_root: str | Path, corpus: dict, process_peaks: dict | None = None,
            since: float | None = None) -> dict:
    """One size's figures from the pipeline's files under `output_root`: per rule the TSV's wall time and
    max_rss, and the largest single process (from /proc while it ran, and the stage's own per-process figures);
    tokenize_corpus's speed and counts; each training stage's time to its first step and peak memory.
    `since` (epoch seconds) marks the rules whose TSV was written by this invocation."""
    root = Path(output_root)
    process_peaks = process_peaks or {}
    corpus_metrics = read_metrics(root / "corpus" / "metrics.json")
    training = {rule: read_metrics(root / path) for rule, path in TRAINING_METRICS.items()}
    rules = {}
    for rule in RULES:
        tsv_path = root / "benchmarks" / f"{rule}.tsv"
        row = read_benchmark_tsv(tsv_path) or {"wall_seconds": None, "max_rss_mib": None, "cpu_seconds": None}
        seen = process_peaks.get(rule, {})  # exact high-water marks, when the rule ran under ProcessPeaks
        reported = stage_reported_peaks(rule, corpus_metrics, training.get(rule, {}))
        per_process = {role: max(seen.get(role, 0.0), reported.get(role, 0.0)) for role in {**seen, **reported}}
        if seen:
            process_peak, exact = max(per_process.values()), True
            source = "/proc high-water marks and the stage's metrics"
        elif rule == "tokenize_corpus" and reported:
            process_peak, exact = max(reported.values()), True  # getrusage's peaks of the process and its workers
            source = "the stage's metrics (main process and largest worker)"
        else:
            # Not seen running (Snakemake found it up to date under --reuse): the best figure left is the larger
            # of Snakemake's, the tree sum of one process and its shell, sampled every 0.5 s for the first 15 s
            # and every 30 s after, and a training stage's peak_memory_mib, read when training ends (before
            # evaluation and saving). Both can miss the true peak.
            process_peak, exact = max([row["max_rss_mib"] or 0.0, *reported.values()]) or None, False
            source = "snakemake max_rss or the stage's metrics (sampled: a lower bound)"
        rules[rule] = {
            **row,
            "process_peak_rss_mib": process_peak,
            "process_peak_exact": exact,
            "process_peak_source": source,
            "process_peaks_by_role_mib": per_process,
            "ran_this_invocation": bool(since and tsv_path.is_file() and tsv_path.stat().st_mtime >= since),
        }
    return {
        "corpus": {key: corpus.get(key) for key in ("path", "bytes", "lines", "words", "heading_lines",
                                                     "paragraph_lines", "article_lines", "seed", "generate_seconds")},
        "n_tokens": corpus_metrics.get("n_tokens"),
        "n_documents": corpus_metrics.get("n_documents"),
        "rules": rules,
        "tokenize": {key: corpus_metrics.get(key) for key in ("text_megabytes", "tokenize_seconds",
                                                              "tokenize_mb_per_second", "workers", "peak_rss_mib")},
        "first_step_seconds": {rule: training[rule].get("first_step_seconds") for rule in TRAINING_METRICS},
        "training_peak_memory_mib": {rule: training[rule].get("peak_memory_mib") for rule in TRAINING_METRICS},
    }


def stage_reported_peaks(rule: str, corpus_metrics: dict, training_metrics: dict) -> dict[str, float]:
    """The per-process peaks a stage writes into its metrics.json, by role (as ProcessPeaks names them)."""
    if rule == "tokenize_corpus" and corpus_metrics.get("peak_rss_mib"):
        reported = corpus_metrics["peak_rss_mib"]
        return {"main": reported.get("self") or 0.0, "child": reported.get("largest_child") or 0.0}
    if training_metrics.get("peak_memory_mib"):
        role = "rank0" if (training_metrics.get("processes") or 1) > 1 else "main"
        return {role: training_metrics["peak_memory_mib"]}
    return {}


def collect_distributed(output_root: str | Path, process_peaks: dict | None = None) -> dict:
    """The DDP rerun of distill_pretrain: its TSV, rank 0's peak from metrics.json and every rank's from /proc."""
    root = Path(output_root)
    rule = "distill_pretrain_main"
    metrics = read_metrics(root / TRAINING_METRICS[rule])
    roles = dict((process_peaks or {}).get(rule, {}))
    if metrics.get("peak_memory_mib"):
        roles["rank0"] = max(roles.get("rank0", 0.0), metrics["peak_memory_mib"])
    return {
        "processes": metrics.get("processes"),
        "rule": read_benchmark_tsv(root / "benchmarks" / f"{rule}.tsv"),
        "rank0_peak_memory_mib": metrics.get("peak_memory_mib"),
        "process_peaks_by_role_mib": roles,
        "first_step_seconds": metrics.get("first_step_seconds"),
        "tokens_per_second": metrics.get("tokens_per_second"),
    }


# ------------------------------------------------------------------------------------------------ goals

PEAK_RSS_LIMIT_MIB = 3072
MAX_PEAK_GROWTH = 1.25
MIN_SPEED_VS_LIBRARY = 0.5
MAX_FIRST_STEP_GROWTH = 1.25
FIRST_STEP_SLACK_SECONDS = 5.0


def evaluate_goals(sizes: list[dict], distributed: dict | None = None) -> dict:
    """The goals, each with its numbers and `passed` (None when the runs given cannot decide it):
    every process's peak RSS at the largest size under 3 GiB and at most 1.25x its figure at the smallest;
    tokenize_corpus at least half the library's speed at every size; each training stage's time to its first
    step at the largest size at most 1.25x the smallest's, or within 5 s of it; each rank of the distributed run
    under 3 GiB. `sizes` are collect() results with `size_gb` and `tokenize_speed_vs_library`, any order."""
    ordered = sorted(sizes, key=lambda size: size["size_gb"])
    smallest, largest = (ordered[0], ordered[-1]) if ordered else (None, None)
    goals: dict[str, Any] = {}

    if largest:
        peaks = {rule: info["process_peak_rss_mib"] for rule, info in largest["rules"].items()
                 if info.get("process_peak_rss_mib") is not None}
        worst = max(peaks, key=peaks.get) if peaks else None
        # Sampled figures are lower bounds: over the limit they fail, under it they decide nothing.
        exact = bool(peaks) and all(largest["rules"][rule].get("process_peak_exact") for rule in peaks)
        goals["peak_rss_under_limit"] = {
            "passed": verdict([mib < PEAK_RSS_LIMIT_MIB for mib in peaks.values()], complete=exact),
            "limit_mib": PEAK_RSS_LIMIT_MIB, "size_gb": largest["size_gb"], "by_rule_mib": peaks,
            "largest_mib": peaks.get(worst), "largest_rule": worst,
        }

    if smallest is not largest:
        ratios, sampled = {}, []
        for rule, info in largest["rules"].items():
            before_info = smallest["rules"].get(rule, {})
            before, after = before_info.get("process_peak_rss_mib"), info.get("process_peak_rss_mib")
            if not (info.get("process_peak_exact") and before_info.get("process_peak_exact")):
                sampled.append(rule)  # a sampled figure can be off either way: no ratio from it
            elif before and after is not None:
                ratios[rule] = round(after / before, 3)
        worst = max(ratios, key=ratios.get) if ratios else None
        goals["peak_rss_flat"] = {
            "passed": verdict([r <= MAX_PEAK_GROWTH for r in ratios.values()], complete=bool(ratios) and not sampled),
            "rules_not_measured_exactly": sampled,
            "max_ratio": MAX_PEAK_GROWTH, "from_size_gb": smallest["size_gb"], "to_size_gb": largest["size_gb"],
            "ratio_by_rule": ratios, "largest_ratio": ratios.get(worst), "largest_ratio_rule": worst,
        }
        stages = {}
        for rule, after in largest["first_step_seconds"].items():
            before = smallest["first_step_seconds"].get(rule)
            if before is None or after is None:
                continue
            ratio = after / before if before > 0 else None
            stages[rule] = {
                "from_seconds": before, "to_seconds": after, "ratio": None if ratio is None else round(ratio, 3),
                "passed": (ratio is not None and ratio <= MAX_FIRST_STEP_GROWTH)
                or after - before <= FIRST_STEP_SLACK_SECONDS,
            }
        goals["first_step_flat"] = {
            "passed": verdict([stage["passed"] for stage in stages.values()], complete=bool(stages)),
            "max_ratio": MAX_FIRST_STEP_GROWTH, "slack_seconds": FIRST_STEP_SLACK_SECONDS,
            "from_size_gb": smallest["size_gb"], "to_size_gb": largest["size_gb"], "by_stage": stages,
        }
    else:
        goals["peak_rss_flat"] = {"passed": None, "reason": "needs two sizes"}
        goals["first_step_flat"] = {"passed": None, "reason": "needs two sizes"}

    speed = {str(size["size_gb"]): size.get("tokenize_speed_vs_library") for size in ordered}
    known = [ratio for ratio in speed.values() if ratio is not None]
    goals["tokenize_vs_library"] = {
        "passed": verdict([r >= MIN_SPEED_VS_LIBRARY for r in known], complete=len(known) == len(speed) > 0),
        "min_ratio": MIN_SPEED_VS_LIBRARY, "ratio_by_size_gb": speed,
    }

    if distributed and distributed.get("error"):
        goals["distributed_ranks_under_limit"] = {
            "passed": False, "reason": "the distributed run failed", "error": distributed["error"].splitlines()[0],
            "rank_peaks_mib": {role: mib for role, mib in distributed.get("process_peaks_by_role_mib", {}).items()
                              if role.startswith("rank")},
        }
    elif distributed:
        ranks = {role: mib for role, mib in distributed.get("process_peaks_by_role_mib", {}).items()
                 if role.startswith("rank")}
        expected = distributed.get("processes") or 0
        goals["distributed_ranks_under_limit"] = {
            # every rank must have been seen (rank 0 from metrics.json, the others from /proc)
            "passed": verdict([mib < PEAK_RSS_LIMIT_MIB for mib in ranks.values()],
                              complete=len(ranks) >= expected > 1),
            "limit_mib": PEAK_RSS_LIMIT_MIB, "processes": expected, "rank_peaks_mib": ranks,
            "rule_max_rss_mib": (distributed.get("rule") or {}).get("max_rss_mib"),
        }
    else:
        goals["distributed_ranks_under_limit"] = {"passed": None, "reason": "no distributed run"}

    goals["all_passed"] = all(goal["passed"] is True for goal in goals.values() if isinstance(goal, dict))
    return goals


def verdict(checks: list[bool], complete: bool) -> bool | None:
    """False when any check fails; True when all pass and nothing is missing; None (undecided) otherwise."""
    if not all(checks):
        return False
    return True if complete and checks else None


# ------------------------------------------------------------------------------------------------ main


def size_label(size_gb: float) -> str:
    return f"{size_gb:g}gb"


def print_table(result: dict) -> None:
    print(f"\n{result['machine']['cpu']} ({result['machine']['cores']} cores)")
    for size in result["sizes"]:
        corpus = size["corpus"]
        print(f"\n{size_label(size['size_gb'])}: {corpus['bytes'] / 1e6:,.1f} MB, {corpus['lines']:,} lines, "
              f"{size['n_tokens'] or 0:,} tokens")
        print(f"  {'rule':<24}{'wall s':>9}{'max_rss MiB':>12}{'process peak MiB':>17}")
        for rule, info in size["rules"].items():
            print(f"  {rule:<24}{fmt(info['wall_seconds']):>9}{fmt(info['max_rss_mib']):>12}"
                  f"{fmt(info['process_peak_rss_mib']):>17}")
        tokenize = size["tokenize"]
        print(f"  tokenize: pipeline {fmt(tokenize['tokenize_mb_per_second'], 1)} MB/s, library "
              f"{fmt(size['library']['tokenize_mb_per_second'], 1)} MB/s "
              f"(x{fmt(size['tokenize_speed_vs_library'], 2)})")
        print("  first step: " + ", ".join(f"{rule} {fmt(seconds, 1)} s"
                                          for rule, seconds in size["first_step_seconds"].items()))
    if result.get("distributed"):
        run = result["distributed"]
        ranks = ", ".join(f"{role} {fmt(mib)} MiB" for role, mib in sorted(run["process_peaks_by_role_mib"].items()))
        outcome = f"FAILED ({run['log']})" if run.get("error") else \
            f"rule max_rss {fmt((run.get('rule') or {}).get('max_rss_mib'))} MiB"
        print(f"\ndistill_pretrain, {run['processes']} processes on {size_label(run['size_gb'])}: {outcome}; {ranks}")
    for failure in result.get("failures", []):
        print(f"\n{size_label(failure['size_gb'])}: FAILED ({failure['log']})")
    print("\ngoals:")
    for name, goal in result["goals"].items():
        if isinstance(goal, dict):
            verdict_word = {True: "pass", False: "FAIL", None: "n/a"}[goal["passed"]]
            print(f"  {name:<32}{verdict_word:<6}{goal_figures(goal)}")
    print(f"  {'all passed':<32}{result['goals']['all_passed']}")


def goal_figures(goal: dict) -> str:
    """The numbers behind a goal, in one line."""
    if "reason" in goal:
        return goal["reason"]
    if "largest_mib" in goal:
        return f"largest {fmt(goal['largest_mib'])} MiB ({goal['largest_rule']}), limit {goal['limit_mib']} MiB"
    if "largest_ratio" in goal:
        return f"largest x{fmt(goal['largest_ratio'], 2)} ({goal['largest_ratio_rule']}), limit x{goal['max_ratio']}"
    if "by_stage" in goal:
        return ", ".join(f"{rule} {fmt(s['from_seconds'], 1)} -> {fmt(s['to_seconds'], 1)} s"
                         for rule, s in goal["by_stage"].items())
    if "ratio_by_size_gb" in goal:
        return ", ".join(f"{size} GB x{fmt(r, 2)}" for size, r in goal["ratio_by_size_gb"].items()) + \
            f" (at least x{goal['min_ratio']})"
    if "rank_peaks_mib" in goal:
        return ", ".join(f"{rank} {fmt(mib)} MiB" for rank, mib in sorted(goal["rank_peaks_mib"].items()))
    return ""


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[0.3, 1.0], help="corpus sizes (10^9 bytes)")
    parser.add_argument("--seed", type=int, default=0, help="corpus generator seed")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="snakemake --cores, and the library's")
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / "artifacts" / "corpus_scale")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "corpus_scale.json")
    parser.add_argument("--library-sample-mb", type=float, default=100.0, help="text the library baseline encodes")
    parser.add_argument("--distributed-processes", type=int, default=2, help="0 skips the distributed rerun")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the sizes' pipeline outputs (by default they are deleted and every rule runs)")
    parser.add_argument("--timeout-minutes", type=float, default=180, help="limit of each size's Snakemake run")
    parser.add_argument("--distributed-timeout-minutes", type=float, default=30,
                        help="limit of the distributed rerun (at least 3x the one-process rule's wall time): a "
                             "hung rank fails it, and the failure is recorded")
    args = parser.parse_args(argv)

    work = args.work_dir.resolve()
    cpu = cpu_description()
    result = {
        "machine": {"cpu": cpu["model_name"], "cpu_flags": cpu["simd_flags"], "cores": os.cpu_count(),
                    "cores_given": args.cores},
        "libraries": library_versions(("torch", "transformers", "tokenizers", "numpy", "snakemake")),
        "seed": args.seed,
        "sizes": [],
        "distributed": None,
        "failures": [],
    }
    for size_gb in sorted(args.sizes_gb):
        try:
            result["sizes"].append(measure_size(size_gb, work, args))
        except PipelineFailed as failure:
            result["failures"].append({"size_gb": size_gb, "error": str(failure), "log": failure.log})
            print(failure, file=sys.stderr)
            break
        finally:
            write_result(result, args.out)  # what is measured so far survives a later failure

    if args.distributed_processes > 1 and result["sizes"] and not result["failures"]:
        result["distributed"] = measure_distributed(result["sizes"][-1], work, args)
        write_result(result, args.out)
    print_table(result)
    print(f"\nwrote {args.out}")
    return 0 if result["goals"]["all_passed"] else 1


def measure_size(size_gb: float, work: Path, args: argparse.Namespace) -> dict:
    """One size: its corpus, the pipeline run, the library baseline on the same text."""
    label = size_label(size_gb)
    corpus = generate_corpus(work / "corpora" / f"corpus-{label}-seed{args.seed}.txt", int(size_gb * 1e9), args.seed)
    print(f"{label}: corpus {corpus['path']} ({'reused' if corpus['reused'] else 'generated'} "
          f"in {corpus['generate_seconds']} s)", flush=True)
    output_root = work / label
    if not args.reuse:
        shutil.rmtree(output_root, ignore_errors=True)
    started = time.time()
    run = run_pipeline(corpus["path"], output_root, args.cores, timeout_seconds=args.timeout_minutes * 60)
    print(f"{label}: pipeline done in {run['seconds']} s ({run['log']})", flush=True)
    size = {"size_gb": size_gb, **collect(output_root, corpus, run["process_peaks"], since=started),
            "snakemake": {key: run[key] for key in ("command", "config_file", "log", "seconds")}}
    size["library"] = library_tokenize_speed(corpus["path"], output_root / "tokenizer" / "tokenizer.json",
                                             args.cores, int(args.library_sample_mb * 1e6))
    pipeline_speed = size["tokenize"]["tokenize_mb_per_second"]
    library_speed = size["library"]["tokenize_mb_per_second"]
    size["tokenize_speed_vs_library"] = (round(pipeline_speed / library_speed, 3)
                                         if pipeline_speed and library_speed else None)
    return size


def measure_distributed(largest: dict, work: Path, args: argparse.Namespace) -> dict:
    """distill_pretrain alone again on the largest size, as `--distributed-processes` DDP processes; a failure
    or a hang past its timeout is recorded (with the peaks seen until then), not raised."""
    output_root = work / size_label(largest["size_gb"])
    # Rank 0 evaluates the whole hold-out (5 % of the corpus) after training: allow three one-process runs.
    one_process_seconds = largest["rules"]["distill_pretrain_main"]["wall_seconds"] or 0.0
    timeout_seconds = max(args.distributed_timeout_minutes * 60, 3 * one_process_seconds)
    try:
        run = run_pipeline(largest["corpus"]["path"], output_root, args.cores, processes=args.distributed_processes,
                           only_rule="distill_pretrain", timeout_seconds=timeout_seconds)
    except PipelineFailed as failure:
        print(failure, file=sys.stderr)
        return {"size_gb": largest["size_gb"], "processes": args.distributed_processes, "error": str(failure),
                "log": failure.log,
                "process_peaks_by_role_mib": failure.process_peaks.get("distill_pretrain_main", {})}
    print(f"distributed distill_pretrain done in {run['seconds']} s ({run['log']})", flush=True)
    return {"size_gb": largest["size_gb"], **collect_distributed(output_root, run["process_peaks"]),
            "snakemake": {key: run[key] for key in ("command", "config_file", "log", "seconds")}}


def write_result(result: dict, out: Path) -> None:
    result["goals"] = evaluate_goals(result["sizes"], result["distributed"])
    if result["failures"]:  # a size that did not run decides nothing, but nothing passed either
        result["goals"]["all_passed"] = False
    atomic_write_json(out, result)


if __name__ == "__main__":
    libraries_loaded()  # collection resumes (benchmarks/__init__.py)
    raise SystemExit(main())
