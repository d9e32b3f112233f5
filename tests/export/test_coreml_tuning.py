"""The CoreML packages' fallback (pipeline/export/coreml_tuning.py) on the tiny student: each layer's sensitivity,
and the most sensitive layers kept in float, through compress_with_fallback (what export_coreml calls)."""

import copy

from pipeline.export import coreml
from pipeline.export.coreml_tuning import compress_with_fallback, proxy_tuning


def distinct_weights(model, name: str) -> int:
    return int(dict(model.named_modules())[name].weight.detach().unique().numel())


def test_the_most_sensitive_layers_stay_in_float_and_the_others_are_palettized(exported_student):
    cfg, data, student = copy.deepcopy(exported_student["cfg"]), exported_student["data"], exported_student["student"]
    fallback = cfg.export.quantize.fallback
    fallback.max_layers = 2
    fallback.target_f1_drop = -1.0  # out of reach (the schema's minimum is 0): every step is taken
    tuning, source = proxy_tuning(data, student, True, cfg)
    assert "held-out dev questions" in source and len(tuning.gold) > 0
    model, record = compress_with_fallback(student, True, "4bit", cfg, tuning)
    layers = coreml.compressible_layers(coreml.load_wrapped(student, True), "4bit", cfg.export.coreml)
    assert sorted(record["sensitivity"]) == sorted(layers)
    assert list(record["sensitivity"].values()) == sorted(record["sensitivity"].values(), reverse=True)
    assert [step["layer"] for step in record["steps"]] == list(record["sensitivity"])[:2]
    kept = record["fell_back"]
    assert kept == list(record["sensitivity"])[:len(kept)]
    assert record["after"]["f1_drop"] == min([record["before"]["f1_drop"]] + [s["f1_drop"] for s in record["steps"]])
    # 4 bits, one lookup table per tensor: at most 16 distinct values in a palettized weight; a layer kept in
    # float has its own many
    assert cfg.export.coreml.palettization_granularity == "per_tensor"
    original = coreml.load_wrapped(student, True)
    for name in layers:
        if name in kept:
            assert distinct_weights(model, name) == distinct_weights(original, name) > 16
        else:
            assert distinct_weights(model, name) <= 16
    # and the package says so: fewer palettized weight tensors, by the layers kept
    assert coreml.weight_matrix_count(original.model, "4bit", cfg.export.coreml, len(kept)) == len(layers) - len(kept)


def test_no_fallback_where_the_compressed_proxy_is_within_the_target(exported_student):
    cfg, data, student = copy.deepcopy(exported_student["cfg"]), exported_student["data"], exported_student["student"]
    cfg.export.quantize.fallback.target_f1_drop = 100.0
    tuning, _ = proxy_tuning(data, student, True, cfg)
    _, record = compress_with_fallback(student, True, "int8", cfg, tuning)
    assert record["fell_back"] == [] and record["tuned"] == "shown within the target"
    _, record = compress_with_fallback(student, True, "fp16", cfg, tuning)
    assert record is None
