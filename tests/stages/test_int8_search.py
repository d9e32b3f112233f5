"""Stage int8_search: the full-size int8 search, on a small stand-in of the full-size DistilBERT's folder."""

import json
import shutil

import pytest

from pipeline.export import int8, onnx_graph
from pipeline.export.gates import GateError
from pipeline.plan.model_registry import TRAINED_MODELS
from pipeline.stages import int8_search
from tests.stage_fixtures import tiny_config

RECIPES = {"int8": int8.Int8Recipe("plain", "qoperator", False, False),
           "int8-plain-qoperator-tensor-att8": int8.Int8Recipe("plain", "qoperator", False, True),
           "int8-plain-qoperator-channel-attfp32": int8.Int8Recipe("plain", "qoperator", True, False)}


@pytest.fixture(scope="module")
def searched_root(tmp_path_factory):
    """full_size/distilbert as export_full_size writes it (three int8 recipes of a tiny DistilBERT), and each
    trained model's quantize.json: the per-channel recipe failed its gates on the teacher."""
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    root = tmp_path_factory.mktemp("search")
    folder = root / "full_size" / "distilbert"
    model = DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=2,
                                                            hidden_dim=64, max_position_embeddings=128))
    model.save_pretrained(folder / "pytorch")
    onnx_graph.export_fp32(folder / "pytorch", folder / "onnx" / "fp32", None)
    for name, recipe in RECIPES.items():
        (folder / "onnx" / name).mkdir(parents=True)
        int8.quantize_int8(folder / "onnx" / "fp32" / "model.onnx", folder / "onnx" / name / "model.onnx", recipe,
                           False)
    (folder / "full_size.json").write_text(json.dumps({"int8_recipes": {n: r.__dict__ for n, r in RECIPES.items()}}))
    for model_name in TRAINED_MODELS:
        passed = {"int8": True, "int8-plain-qoperator-tensor-att8": True,
                  "int8-plain-qoperator-channel-attfp32": model_name != "teacher"}
        (root / "quantized" / model_name).mkdir(parents=True)
        (root / "quantized" / model_name / "quantize.json").write_text(
            json.dumps({"variants": {name: {"passed": ok} for name, ok in passed.items()}}))
    return root


def search_config():
    return tiny_config(export={"models": list(TRAINED_MODELS)},  # every trained model, as configs/default.yaml
                       benchmark={"sequence_lengths": [32], "search_runs": 3, "warmup": 1,
                                  "session_options": ["default", "denormals-as-zero"]})


def test_the_search_times_only_recipes_that_passed_on_every_model_and_writes_its_choice(searched_root, tmp_path):
    """A recipe that failed its gates on any trained model is never a candidate; the choice is the fastest
    (recipe, session options) pair of the second round, the runner-up another recipe; choice.json holds the chosen
    recipe alone, what the builds that apply it read."""
    search = int8_search.run(search_config(), searched_root, tmp_path / "int8_search")
    assert set(search["candidates"]) == {"int8", "int8-plain-qoperator-tensor-att8"}
    assert search["rejected_by_gates"] == {"int8-plain-qoperator-channel-attfp32": {
        "student": True, "student_ce_only": True, "teacher": False}}
    assert len(search["session_options"]) == 4  # two finalists x two option sets
    timings = {key: entry["latency_ms"] for key, entry in search["session_options"].items()}
    pairs = {key: (entry["recipe"], entry["session_options"]) for key, entry in search["session_options"].items()}
    fastest = min(timings, key=lambda key: timings[key]["p50"])
    tie = search_config().export.quantize.latency_tie_fraction
    chosen, decided_by = int8.default_options_within_tie(timings, pairs, fastest, tie)
    assert (search["choice"]["recipe"], search["choice"]["session_options"]) == pairs[chosen]
    assert search["choice"]["decided_by"] == decided_by and search["choice"]["latency_ms"] == timings[chosen]
    assert search["runner_up"]["recipe"] != search["choice"]["recipe"]
    assert json.loads((tmp_path / "int8_search" / "int8_search.json").read_text()) == search
    choice = json.loads((tmp_path / "int8_search" / "choice.json").read_text())
    assert choice == {"recipe": search["choice"]["recipe"], "int8_recipe": RECIPES[choice["recipe"]].__dict__}


def test_with_no_recipe_passing_anywhere_the_search_stops_naming_the_verdicts(searched_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(searched_root, root)
    for model_name in TRAINED_MODELS:
        path = root / "quantized" / model_name / "quantize.json"
        path.write_text(json.dumps({"variants": {name: {"passed": False} for name in RECIPES}}))
    with pytest.raises(GateError, match="no int8 recipe of the full-size build passed its gates"):
        int8_search.run(search_config(), root, tmp_path / "int8_search")
    assert not (tmp_path / "int8_search" / "choice.json").exists()


PAIRS = {"a|default": ("a", "default"), "a|denormals-as-zero": ("a", "denormals-as-zero"),
         "b|default": ("b", "default"), "b|denormals-as-zero": ("b", "denormals-as-zero")}


def timings(**p50):
    return {key.replace("_daz", "|denormals-as-zero").replace("_default", "|default"): {"p50": ms, "p90": ms + 1}
            for key, ms in p50.items()}


def test_other_session_options_win_only_beyond_the_tie():
    """The fastest pair with onnxruntime's default options is chosen where it is within the tie of the fastest pair
    (the bundle's export.quantize.latency_tie_fraction); options beyond it, or a fastest pair with default options,
    are taken as they are."""
    within = timings(a_daz=100.0, a_default=104.0, b_daz=101.0, b_default=102.0)
    chosen, why = int8.default_options_within_tie(within, PAIRS, "a|denormals-as-zero", 0.05)
    assert chosen == "b|default" and why.startswith("a tie: denormals-as-zero 100.0 ms against 102.0 ms")
    same_recipe = timings(a_daz=100.0, a_default=104.0, b_daz=101.0, b_default=106.0)
    assert int8.default_options_within_tie(same_recipe, PAIRS, "a|denormals-as-zero", 0.05)[0] == "a|default"
    beyond = timings(a_daz=100.0, a_default=106.0, b_daz=101.0, b_default=105.5)
    chosen, why = int8.default_options_within_tie(beyond, PAIRS, "a|denormals-as-zero", 0.05)
    assert chosen == "a|denormals-as-zero" and "beyond the 5% tie" in why
    chosen, why = int8.default_options_within_tie(within, PAIRS, "a|denormals-as-zero", 0.0)
    assert chosen == "a|denormals-as-zero"  # no tie at all
    default_fastest = timings(a_daz=101.0, a_default=100.0, b_daz=103.0, b_default=102.0)
    assert int8.default_options_within_tie(default_fastest, PAIRS, "a|default", 0.05) == ("a|default",
                                                                                          "the fastest median")
    without_default = {"a|denormals-as-zero": {"p50": 100.0, "p90": 101.0}}
    assert int8.default_options_within_tie(without_default, PAIRS, "a|denormals-as-zero", 0.05)[0] == \
        "a|denormals-as-zero"  # benchmark.session_options without "default": nothing to keep


def test_with_one_recipe_passing_the_runner_up_is_never_the_choice(searched_root, tmp_path, monkeypatch):
    """One finalist, its default options within the tie of its fastest options: the choice takes the default ones,
    and the runner-up is the other option set, not the choice again."""
    root = tmp_path / "root"
    shutil.copytree(searched_root, root)
    for model_name in TRAINED_MODELS:
        path = root / "quantized" / model_name / "quantize.json"
        path.write_text(json.dumps({"variants": {name: {"passed": name == "int8"} for name in RECIPES}}))
    p50 = {"int8|default": 101.0, "int8|denormals-as-zero": 100.0}

    def compare_latency(paths, *args, option_sets=None, **kwargs):
        return {key: {"p50": p50.get(key, 100.0), "p90": p50.get(key, 100.0) + 1} for key in paths}

    monkeypatch.setattr(int8, "compare_latency", compare_latency)
    search = int8_search.run(search_config(), root, tmp_path / "int8_search")
    assert (search["choice"]["recipe"], search["choice"]["session_options"]) == ("int8", "default")
    assert search["choice"]["decided_by"].startswith("a tie")
    assert (search["runner_up"]["recipe"], search["runner_up"]["session_options"]) == ("int8", "denormals-as-zero")
