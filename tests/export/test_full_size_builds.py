"""Stages export_full_size_int8 and export_gemm_floor, the full-size builds the benchmark times, on small stand-ins
of export_full_size's folders (the real architectures take minutes); and the benchmark reading what they built."""

import json

import onnx
import pytest

from pipeline.export import int8
from pipeline.export.gemm_floor import GemmFloorError, gemm_floor_graph
from pipeline.stages import benchmark, export_full_size, export_full_size_int8, export_gemm_floor
from tests.stage_fixtures import EXPORT_RELAXED, tiny_config

CFG = tiny_config(export={"quantize": EXPORT_RELAXED["quantize"]})


def small_model(architecture, out_dir, pretrained, seed):
    """export_full_size.save_full_size's stand-in: the same architecture, a few thousand parameters."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering, DistilBertConfig, DistilBertForQuestionAnswering

    torch.manual_seed(seed)
    if architecture == "distilbert":
        model = DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=300, dim=32, n_layers=2, n_heads=2,
                                                                hidden_dim=64, max_position_embeddings=128))
    else:
        model = BertForQuestionAnswering(BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=64,
                                                    max_position_embeddings=128))
    model.save_pretrained(out_dir)
    return model.num_parameters()


@pytest.fixture(scope="module")
def full_size_root(tmp_path_factory):
    """full_size/distilbert (every int8 recipe of the grid) and full_size/bert-base (the naive one), as
    export_full_size writes them; no CoreML packages (tests/stages/test_export.py checks those)."""
    root = tmp_path_factory.mktemp("root")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export_full_size, "save_full_size", small_model)
        patch.setattr(export_full_size, "export_coreml_packages", lambda *args: {})
        for architecture in ("distilbert", "bert-base"):
            export_full_size.run(CFG, architecture, root / "full_size" / architecture)
    return root


def write_choice(path, recipe_name, recipes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"recipe": recipe_name, "int8_recipe": recipes[recipe_name]}))
    return path


def test_the_searched_recipe_is_built_by_the_recipe_builder_of_export_full_size(full_size_root, tmp_path):
    """Applied to the DistilBERT folder itself, export_full_size_int8 gives export_full_size's own graph of that
    recipe: one builder, the same calibration."""
    distilbert = full_size_root / "full_size" / "distilbert"
    recipes = json.loads((distilbert / "full_size.json").read_text())["int8_recipes"]
    for name in ("int8-noattn-qdq-channel-att8", "int8-fused-qoperator-channel-attfp32"):  # calibrated; fused graph
        choice = write_choice(tmp_path / name / "choice.json", name, recipes)
        report = export_full_size_int8.run(CFG, distilbert, choice, tmp_path / name / "out")
        assert report["recipe"] == name and report["path"] == f"{name}/model.onnx" and report["size_mb"] > 0
        built = onnx.load(str(tmp_path / name / "out" / name / "model.onnx"))
        reference = onnx.load(str(distilbert / "onnx" / name / "model.onnx"))
        assert [node.op_type for node in built.graph.node] == [node.op_type for node in reference.graph.node]
        assert ({i.name: i.SerializeToString() for i in built.graph.initializer}
                == {i.name: i.SerializeToString() for i in reference.graph.initializer})
        assert {path.name for path in (tmp_path / name / "out").iterdir()} == {
            "full_size_int8.json", "manifest.json", name}  # no intermediate fp32 graphs


def test_bert_base_gets_the_searched_recipe_and_the_naive_one_is_its_own_graph(full_size_root, tmp_path):
    bert_base = full_size_root / "full_size" / "bert-base"
    recipes = json.loads((full_size_root / "full_size" / "distilbert" / "full_size.json").read_text())["int8_recipes"]
    name = "int8-plain-qoperator-channel-att8"
    report = export_full_size_int8.run(CFG, bert_base, write_choice(tmp_path / "choice.json", name, recipes),
                                       tmp_path / "searched")
    assert report["architecture"] == "bert-base" and report["int8_recipe"] == recipes[name]
    ops = {node.op_type for node in onnx.load(str(tmp_path / "searched" / name / "model.onnx")).graph.node}
    assert "MatMul" not in ops and "MatMulInteger" in ops  # att8: attention's products are int8 too
    naive = export_full_size_int8.run(CFG, bert_base, write_choice(tmp_path / "naive.json", int8.NAIVE, recipes),
                                      tmp_path / "naive")
    assert naive["path"] == "int8/model.onnx"
    assert ((tmp_path / "naive" / "int8" / "model.onnx").read_bytes()
            == (bert_base / "onnx" / "int8" / "model.onnx").read_bytes())


def test_the_gemm_floor_graph_holds_exactly_the_models_int8_matmuls(full_size_root, tmp_path):
    distilbert = full_size_root / "full_size" / "distilbert"
    report = export_gemm_floor.run(CFG, distilbert, 48, tmp_path / "gemm_floor")
    naive = onnx.load(str(distilbert / "onnx" / "int8" / "model.onnx"))
    floor = onnx.load(str(tmp_path / "gemm_floor" / report["path"]))
    assert report["n_matmul_integer"] == sum(node.op_type == "MatMulInteger" for node in naive.graph.node)
    assert report["n_matmul_integer"] == len(floor.graph.node) > 0 and report["sequence_length"] == 48
    assert {node.op_type for node in floor.graph.node} == {"MatMulInteger"}
    assert {tuple(d.dim_value for d in i.type.tensor_type.shape.dim)[:2] for i in floor.graph.input} == {(1, 48)}
    timing = benchmark.time_gemm_floor(tmp_path / "gemm_floor" / report["path"], CFG.benchmark)
    assert 0 < timing["p50"] <= timing["p90"]
    with pytest.raises(GemmFloorError, match="no MatMulInteger"):
        gemm_floor_graph(distilbert / "onnx" / "fp32" / "model.onnx", 48, tmp_path / "none.onnx")


def test_the_benchmark_times_the_graph_built_for_the_searched_recipe_and_no_other(full_size_root, tmp_path):
    recipes = json.loads((full_size_root / "full_size" / "distilbert" / "full_size.json").read_text())["int8_recipes"]
    name = "int8-plain-qoperator-channel-att8"
    root = tmp_path / "root"
    (root / "full_size").mkdir(parents=True)
    for architecture in ("distilbert", "bert-base"):
        (root / "full_size" / architecture).symlink_to(full_size_root / "full_size" / architecture)
    export_full_size_int8.run(CFG, root / "full_size" / "bert-base", write_choice(tmp_path / "c.json", name, recipes),
                              root / "full_size_int8" / "bert-base")
    cfg = tiny_config(export={"full_size": {"architectures": ["distilbert", "bert-base"]}})
    search = {"choice": {"recipe": name, "session_options": "denormals-as-zero"}}
    items = {item["name"]: item for item in benchmark.optimized_int8_artifacts(root, cfg, search)}
    assert items["distilbert/onnx-int8-optimized"]["path"] == str(root / "full_size" / "distilbert" / "onnx" / name
                                                                  / "model.onnx")
    assert items["bert-base/onnx-int8-optimized"]["path"] == str(root / "full_size_int8" / "bert-base" / name
                                                                 / "model.onnx")
    assert {item["session_options"] for item in items.values()} == {"denormals-as-zero"}
    other = {"choice": {"recipe": "int8-plain-qoperator-tensor-attfp32", "session_options": "default"}}
    with pytest.raises(benchmark.BenchmarkInputError, match="full_size_int8.json: built with " + name):
        benchmark.optimized_int8_artifacts(root, cfg, other)


def test_the_naive_graph_chosen_is_profiled_once_and_a_searched_one_on_its_own_graph(full_size_root, monkeypatch):
    """The profiler takes no session options: where the search chose the naive graph, its one profile serves both
    rows; another recipe is profiled from its own folder."""
    longest = max(CFG.benchmark.sequence_lengths)
    export_gemm_floor.run(CFG, full_size_root / "full_size" / "distilbert", longest, full_size_root / "gemm_floor")
    profiled = []
    library_profile_graphs = benchmark.profile_graphs

    def profile_graphs(paths, *args):
        profiled.append({name: path.parent.name for name, path in paths.items()})
        return library_profile_graphs(paths, *args)

    monkeypatch.setattr(benchmark, "profile_graphs", profile_graphs)
    naive = {"choice": {"recipe": int8.NAIVE, "session_options": "default"}}
    floor, profiles = benchmark.floor_and_profiles(full_size_root, CFG, naive, [])
    assert profiled == [{"distilbert/onnx-int8": int8.NAIVE}]
    assert profiles["distilbert/onnx-int8-optimized"] is profiles["distilbert/onnx-int8"]
    assert profiles["distilbert/onnx-int8"] and 0 < floor["latency_ms"]["p50"] <= floor["latency_ms"]["p90"]
    searched = {"choice": {"recipe": "int8-plain-qdq-channel-attfp32", "session_options": "default"}}
    _, profiles = benchmark.floor_and_profiles(full_size_root, CFG, searched, [])
    assert profiled[1] == {"distilbert/onnx-int8": int8.NAIVE,
                           "distilbert/onnx-int8-optimized": "int8-plain-qdq-channel-attfp32"}
    assert {op["op"] for op in profiles["distilbert/onnx-int8-optimized"]} >= {"QuantizeLinear", "DequantizeLinear"}
