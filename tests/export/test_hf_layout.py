"""The bundle's huggingface/ folder: listed in the manifest, loaded offline as it is by optimum
(ORTModelForQuestionAnswering through transformers.pipeline) and by transformers.js in Node, answering every dev
question of the tiny build as the torch-free answerer does.

The libraries decode differently from the answerer, so each comparison gives both sides the same settings:
- one window: transformers.js does not window (it truncates the pair at the tokenizer's model_max_length), and
  the transformers pipeline ranks the windows of a context by probabilities normalized within each window where
  the answerer compares logits across windows (utils_qa.py). With windows of model_max_length tokens every dev
  pair fits in one (asserted), and the three see the same tokens.
- the same span search: every start and end of the window (no n-best cut; the pipeline searches all pairs), with
  the bundle's max_answer_length for the pipeline (it takes one) and none for transformers.js (it has none).
- one question per run: the int8 graph quantizes activations with scales computed over the whole batch, padding
  included, so a batch's padding would move the logits.
No difference is tolerated.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.export.hf_layout import HfLayoutError, write_hf_layout
from pipeline.outputs.manifests import file_sha256, verify_manifest
from pipeline.runtime import answering
from tests.paths import PROJECT_ROOT

CLIENT = PROJECT_ROOT / "clients" / "web"
NODE = shutil.which("node")
LAYOUT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                "onnx/model_quantized.onnx")


@pytest.fixture(scope="module")
def layout(exported_student) -> dict:
    """The tiny build's bundle and its huggingface/ folder, its dev questions, and the torch-free answerer on the
    bundle with the settings the libraries use (the module docstring)."""
    bundle = exported_student["bundle"]
    folder = bundle / "huggingface"
    settings = answering.read_qa_config(bundle / "qa_config.json")
    window = json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"]
    answerer = answering.QuestionAnswerer(bundle / settings["onnx"]["model"], bundle / settings["tokenizer"]["file"],
                                        max_seq_length=window, doc_stride=settings["doc_stride"],
                                        n_best_size=window, threads=1)
    lines = (exported_student["data"] / "dev.jsonl").read_text(encoding="utf-8").splitlines()
    questions = [{key: record[key] for key in ("id", "question", "context")} for record in map(json.loads, lines)]
    assert all(len(answerer.windows([question])) == 1 for question in questions), "a dev pair needs two windows"
    return {"bundle": bundle, "folder": folder, "settings": settings, "window": window, "answerer": answerer,
            "questions": questions}


def our_best(answerer: answering.QuestionAnswerer, question: dict, max_answer_length: int) -> dict:
    answerer.max_answer_length = max_answer_length
    return answerer.n_best([question])[question["id"]][0]


def decoded_span(answerer: answering.QuestionAnswerer, question: dict, best: dict) -> str:
    """The answer's tokens decoded as transformers.js decodes its answers (the tokenizer's WordPiece decoder)."""
    window = answerer.windows([question])
    ids = [int(token) for token, offset in zip(window.input_ids[0], window.context_offsets[0])
           if offset is not None and best["start"] <= offset[0] and offset[1] <= best["end"]]
    return answerer.tokenizer.decode(ids)


def transformers_js_answers(folder: Path, questions_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NODE, str(CLIENT / "scripts" / "transformers-js-answer.mjs"), "--model", str(folder),
                           "--questions", str(questions_path)], capture_output=True, text=True, timeout=120)


def test_the_bundle_ships_the_layout_and_its_manifest_lists_it(layout, tmp_path):
    bundle, folder = layout["bundle"], layout["folder"]
    files = verify_manifest(bundle)["files"]
    for name in LAYOUT_FILES:
        assert f"huggingface/{name}" in files, name
    # The very graph and tokenizer the app contract names, not another export of the model.
    assert files["huggingface/onnx/model_quantized.onnx"]["sha256"] == files["model.int8.onnx"]["sha256"]
    assert files["huggingface/tokenizer.json"]["sha256"] == files["tokenizer.json"]["sha256"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "distilbert" and config["transformers.js_config"] == {"dtype": "q8"}

    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    (copy / "huggingface" / "onnx" / "model_quantized.onnx").write_bytes(b"not a model")
    with pytest.raises(answering.BundleError, match="huggingface/onnx/model_quantized.onnx"):
        answering.QuestionAnswerer.from_bundle(copy)


def test_a_folder_without_the_models_config_is_refused_by_name(layout, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    shutil.copy(layout["bundle"] / "tokenizer.json", export / "tokenizer.json")
    with pytest.raises(HfLayoutError, match="no config.json"):
        write_hf_layout(export, layout["bundle"] / "model.int8.onnx", tmp_path / "huggingface")


def test_optimum_loads_the_layout_offline_and_the_transformers_pipeline_answers_as_ours(layout):
    from optimum.onnxruntime import ORTModelForQuestionAnswering
    from transformers import AutoTokenizer, pipeline

    folder, answerer = layout["folder"], layout["answerer"]
    model = ORTModelForQuestionAnswering.from_pretrained(folder, subfolder="onnx", file_name="model_quantized.onnx",
                                                         local_files_only=True)
    assert Path(model.model_path).resolve() == (folder / "onnx" / "model_quantized.onnx").resolve()
    qa = pipeline("question-answering", model=model, tokenizer=AutoTokenizer.from_pretrained(folder, local_files_only=True))
    max_answer_length = layout["settings"]["max_answer_length"]
    for question in layout["questions"]:
        ours = our_best(answerer, question, max_answer_length)
        # align_to_words=False: the span of the best tokens, as ours (by default the pipeline widens it to words).
        theirs = qa(question=question["question"], context=question["context"], max_answer_len=max_answer_length,
                    max_seq_len=layout["window"], doc_stride=layout["settings"]["doc_stride"], align_to_words=False)
        assert (theirs["answer"], theirs["start"], theirs["end"]) == (ours["text"], ours["start"], ours["end"]), \
            question["id"]


@pytest.mark.skipif(NODE is None, reason="Node.js is missing (install Node 20 to run transformers.js)")
@pytest.mark.skipif(not (CLIENT / "node_modules" / "@huggingface" / "transformers").is_dir(),
                    reason="@huggingface/transformers is not installed (`npm ci` in clients/web; setup.sh runs it)")
def test_transformers_js_loads_the_layout_offline_and_answers_as_ours(layout, tmp_path):
    questions_path = tmp_path / "questions.json"
    questions_path.write_text(json.dumps(layout["questions"]), encoding="utf-8")
    completed = transformers_js_answers(layout["folder"], questions_path)
    assert completed.returncode == 0, completed.stderr
    theirs = json.loads(completed.stdout)
    answerer = layout["answerer"]
    for question in layout["questions"]:
        # transformers.js has no answer-length limit: every span of the window is a candidate.
        ours = our_best(answerer, question, layout["window"])
        # Its answer is the span's tokens decoded, lower-cased by the uncased tokenizer, with "##" pieces and spaces
        # around punctuation, so the comparison is with our span's tokens decoded alike, case-insensitively.
        assert theirs[question["id"]]["answer"].casefold() == decoded_span(answerer, question, ours).casefold(), \
            question["id"]

    # The dtype in config.json is what points transformers.js at the int8 file: without it, it wants onnx/model.onnx.
    plain = tmp_path / "without_dtype"
    shutil.copytree(layout["folder"], plain)
    config = json.loads((plain / "config.json").read_text())
    del config["transformers.js_config"]
    (plain / "config.json").write_text(json.dumps(config))
    completed = transformers_js_answers(plain, questions_path)
    assert completed.returncode != 0 and "onnx/model.onnx" in completed.stderr, completed.stderr
