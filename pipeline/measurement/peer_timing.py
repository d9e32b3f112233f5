"""Peers timed in turn, in one process, so a drift in machine speed hits each alike: the torch peer on every
quantized engine (round-robin, to choose its engine), and the peers beside our int8 graph by blocks at every length
and thread count (latency.time_in_blocks: one runtime's spinning threads must not slow another)."""

from __future__ import annotations

from pipeline.measurement.latency import fastest_first, time_in_blocks, time_in_turn
from pipeline.measurement.runners import load_pytorch, runner
from pipeline.measurement.torch_peer import engines_left_out, torch_dynamic_int8, torch_engines
from pipeline.plan.config import BenchmarkConfig


def search_torch_engine(item: dict, cfg: BenchmarkConfig) -> dict:
    """The torch peer on every quantized engine this torch build has for this CPU (torch_peer.torch_engines: those for
    another CPU architecture are listed with why in "engines_left_out"), timed round-robin at the longest length
    with 1 thread (cfg.search_runs each after cfg.warmup), so drift in machine speed hits every engine alike."""
    import torch

    torch.set_num_threads(1)
    fp32 = load_pytorch({**item, "precision": "fp32"})
    length = min(max(cfg.sequence_lengths), item["max_positions"])

    def on_engine(engine: str):
        run_once = runner(item, length, 1, torch_dynamic_int8(fp32, engine))

        def run_on_engine():
            torch.backends.quantized.engine = engine  # the engine its weights were packed for
            run_once()
        return run_on_engine

    engines = time_in_turn({engine: on_engine(engine) for engine in torch_engines()}, cfg.search_runs, cfg.warmup)
    return {"sequence_length": length, "threads": 1, "runs": cfg.search_runs, "engines": engines,
            "engines_left_out": engines_left_out(), "choice": fastest_first(engines)[0]}


def peers_in_turn_with_ours(peers: list[dict], ours: dict, cfg: BenchmarkConfig) -> dict:
    """Every peer and our graph timed in one process, in turn by blocks (latency.time_in_blocks: cfg.runs each after
    cfg.warmup) at every length and thread count, so a drift in machine speed cannot make one look faster, nor one
    runtime's spinning threads slow another; our graph's timing in a cell is every peer's reference. Returns each
    peer's comparison, by name: {seqL: {"threadsN": {"peer": {p50, p90}, "ours": {p50,
    p90}}}}; a length past a peer's positions (or ours) is left out of that peer's."""
    models = {peer["name"]: load_pytorch(peer) if peer["format"] == "pytorch" else None for peer in peers}
    comparison: dict = {peer["name"]: {} for peer in peers}
    for length in cfg.sequence_lengths:
        if length > ours["max_positions"]:
            continue
        fitting = [peer for peer in peers if length <= peer["max_positions"]]
        if not fitting:
            continue
        for threads in cfg.threads:
            if any(model is not None for model in models.values()):
                import torch

                torch.set_num_threads(threads)  # the torch peer's; the ONNX and OpenVINO runners pin their own
            runs_once = {"ours": runner(ours, length, threads)}
            runs_once.update({peer["name"]: runner(peer, length, threads, models[peer["name"]]) for peer in fitting})
            timed = time_in_blocks(runs_once, cfg.runs, cfg.warmup)
            for peer in fitting:
                comparison[peer["name"]].setdefault(f"seq{length}", {})[f"threads{threads}"] = {
                    "peer": timed[peer["name"]], "ours": timed["ours"]}
    return comparison
