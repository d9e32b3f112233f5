"""The JavaScript client (clients/web): the Python answerer's tokens, windows and answers, in Node and in Chromium.

Skips with the reason where Node.js, the client's npm packages or Chromium are missing; setup.sh installs them.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import random

import pytest
from tokenizers import Tokenizer

from pipeline.plan.config import BenchmarkConfig
from pipeline.runtime import answering
from pipeline.stages import benchmark_web
from tests.paths import PROJECT_ROOT

CLIENT = PROJECT_ROOT / "clients" / "web"
NODE = shutil.which("node")
NPM = shutil.which("npm")
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
DEFAULT_RUN = PROJECT_ROOT / "artifacts"

pytestmark = pytest.mark.skipif(
    NODE is None or NPM is None or not (CLIENT / "node_modules" / "onnxruntime-web").is_dir(),
    reason="Node.js, npm or clients/web/node_modules is missing (install Node 20, then `npm ci` in clients/web)",
)
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).is_file() or not (CLIENT / "node_modules" / "puppeteer-core").is_dir(),
    reason=f"Chromium ({CHROMIUM}) or puppeteer-core is missing (apt-get install chromium chromium-driver; npm ci)",
)

# Texts whose tokenization is easy to get wrong: accents (composed and decomposed), punctuation, CJK, Hangul,
# emoji (two UTF-16 units, one code point), controls, special tokens written in the text, and long contexts.
HARD_EXAMPLES = [
    ("accents", "Où est Zoë?", "Zoë Müller vécut à Köln, São Paulo et Reykjavík; elle naquit en 1901. Ko\u0308ln, İstanbul."),
    ("punctuation", "What did (she) say?", 'She said: "Hello—world!" … then left (quickly), didn\'t she?  Yes.'),
    ("cjk", "東京はどこ?", "東京は日本の首都です。The capital is 東京 (Tokyo), population 14,000,000. 서울은 한국의 수도."),
    ("emoji", "Who waved 👋🏽?", "🙂 Ana 👋🏽 waved at Bo\u200b, then\u00a0left\tthe\x07 room\ufeff [SEP] [MASK] ﬁne ＡＢＣ."),
    ("leading spaces", "   Where is it?", "It is in Köln."),
    ("long", "Where did the river flow?",
     " ".join(f"Sentence {i} says the river flowed past tówn {i} (東{i})." for i in range(80))),
]


# Pieces for random strings: the same kinds of characters, plus whole words and special-token look-alikes.
FUZZ_PIECES = list("abcXYZ éÉüÜßİıǅﬁñÑçÇΣ") + [
    "\u0301", "\u0308", "\u3000", "\u00a0", "\t", "\n", "\r", "\x00", "\x07", "\ufeff", "\u200b", "\ufffd", "東", "京",
    "は", "한", "국", "\U00020001", "😀", "👍🏽", "—", "…", "«", "$", "+", "^", "`", "|", "~", ".", ",", "(", "'", '"', "[SEP]",
    "[MASK]", "[CLS", "ǈ", "Ⅻ", "①", "ｱ", "Ａ", "\u2028", "\x85", "a" * 120, "river", "Köln", "São", "1901", "14,000",
]


def fuzz_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(1, 25))) for _ in range(n)]


from clients.web.scripts import check_parity  # noqa: E402  (a namespace package: no __init__.py in clients/)


@pytest.fixture(scope="module")
def tiny(exported_student):
    """A real bundle of a tiny random DistilBERT (the pipeline's own stages), its dev data and model folder: the
    session's shared student export (tests/conftest.py), read only."""
    return exported_student


def dev_questions(data_dir: Path) -> list[dict]:
    return check_parity.read_questions(data_dir / "dev.jsonl")


def write_questions(path: Path, questions: list[dict]) -> Path:
    path.write_text(json.dumps(questions, ensure_ascii=False), encoding="utf-8")
    return path


def hard_questions() -> list[dict]:
    return [{"id": name, "question": question, "context": context} for name, question, context in HARD_EXAMPLES]


def javascript_encodings(tokenizer_path: Path, texts: list[str]) -> list[dict]:
    completed = subprocess.run([NODE, str(CLIENT / "scripts" / "encode.mjs"), "--tokenizer", str(tokenizer_path)],
                               input=json.dumps(texts), capture_output=True, text=True, check=True)
    return json.loads(completed.stdout)


def assert_same_tokens(tokenizer_path: Path, texts: list[str]) -> None:
    python = Tokenizer.from_file(str(tokenizer_path))
    python.no_truncation()
    python.no_padding()
    for text, got in zip(texts, javascript_encodings(tokenizer_path, texts), strict=True):
        encoding = python.encode(text, add_special_tokens=False)
        assert got == {"ids": encoding.ids, "offsets": [list(offset) for offset in encoding.offsets]}, text[:80]


# ------------------------------------------------------------------------------------------------ Node


def test_javascript_unit_tests_and_the_type_declarations_pass():
    """`npm test`: node's test runner on test/ and tsc on the package's TypeScript declarations."""
    completed = subprocess.run([NPM, "test"], cwd=CLIENT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-2000:]


def test_token_ids_and_offsets_equal_python_tokenizers_on_dev_and_hard_texts(tiny):
    questions = dev_questions(tiny["data"]) + hard_questions()
    texts = sorted({q["context"] for q in questions} | {q["question"] for q in questions})
    assert_same_tokens(tiny["bundle"] / "tokenizer.json", texts + fuzz_texts(500))


def test_windows_and_answers_equal_the_python_answerer_on_node_and_web(tiny, tmp_path):
    questions = dev_questions(tiny["data"]) + hard_questions()
    report = check_parity.parity(tiny["bundle"], write_questions(tmp_path / "q.json", questions), ["node", "web"])
    answerer = answering.QuestionAnswerer.from_bundle(tiny["bundle"])
    long_windows = sum(1 for w in answerer.windows(hard_questions()).example_ids
                       if w == "long")
    assert long_windows > 3  # the long context needs several windows at this max_seq_length
    for backend, figures in report["backends"].items():
        assert figures["windows_differing"] == 0, (backend, figures["first_differences"])
        assert figures["answer_agreement"] >= 0.99, (backend, figures["answers_differing"])
        # The code-point span is the Python answerer's; the UTF-16 span cuts the answer out of the context, also
        # behind the emoji of the hard texts, where the two kinds of offsets part.
        assert figures["answer_spans_same"] >= 0.99 * len(questions), (backend, figures["answer_spans_differing"])
        assert figures["utf16_spans_wrong"] == [], backend
        assert figures["utf16_spans_unlike_code_points"] > 0, backend


def test_the_vocab_txt_tokenizer_gives_the_same_windows(tiny, tmp_path):
    questions = write_questions(tmp_path / "q.json", dev_questions(tiny["data"])[:10] + hard_questions())
    report = check_parity.parity(tiny["bundle"], questions, ["node"], tokenizer="vocab")
    assert report["backends"]["node"]["windows_differing"] == 0, report["backends"]["node"]["first_differences"]


def test_a_broken_bundle_or_question_file_is_refused_by_name(tiny, tmp_path):
    broken = tmp_path / "bundle"
    shutil.copytree(tiny["bundle"], broken)
    config = json.loads((broken / "qa_config.json").read_text())
    del config["doc_stride"]
    (broken / "qa_config.json").write_text(json.dumps(config))
    questions = write_questions(tmp_path / "q.json", hard_questions())
    out = tmp_path / "out.json"
    command = [NODE, str(CLIENT / "scripts" / "parity.mjs"), "--bundle", str(broken), "--questions", str(questions),
               "--out", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode == 2 and 'qa_config.json: missing keys ["doc_stride"]' in completed.stderr
    questions.write_text(json.dumps([{"id": "a", "question": 3, "context": "x"}]))
    command[3] = str(tiny["bundle"])
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode == 2 and 'question 0: field "question" must be a string' in completed.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()


# It reads the default DAG's build under artifacts/ (a user's own run): an end-to-end build, out of the edit-test loop
# like the test DAG's, and about half a minute of it on the slowest CPU kind where artifacts/ exists.
@pytest.mark.integration
@pytest.mark.skipif(not (DEFAULT_RUN / "bundle" / "qa_config.json").is_file()
                    or not (DEFAULT_RUN / "data" / "dev.jsonl").is_file(),
                    reason="no default-run bundle and dev set under artifacts/ (run the pipeline first)")
def test_default_run_bundle_parity_on_every_dev_question(tmp_path):
    report = check_parity.parity(DEFAULT_RUN / "bundle", DEFAULT_RUN / "data" / "dev.jsonl", ["node", "web"])
    for backend, figures in report["backends"].items():
        assert figures["windows_differing"] == 0, (backend, figures["first_differences"])
        assert figures["answer_agreement"] >= 0.99, (backend, figures["answers_differing"])
    hard = check_parity.parity(DEFAULT_RUN / "bundle", write_questions(tmp_path / "q.json", hard_questions()), ["node"])
    assert hard["backends"]["node"]["windows_differing"] == 0, hard["backends"]["node"]["first_differences"]
    assert hard["backends"]["node"]["windows"] > len(HARD_EXAMPLES)  # the long context takes several windows


def test_the_test_dags_bundle_answers_as_python_on_node_and_web(dag_run, tmp_path):
    """The parity check as a user runs it (the script's command line) on the bundle the test config's DAG built: the
    client on Node and in Chromium gives the Python answerer's windows and answers on every dev question."""
    out = tmp_path / "parity.json"
    completed = subprocess.run([sys.executable, str(CLIENT / "scripts" / "check_parity.py"),
                                "--bundle", str(dag_run.root / "bundle"),
                                "--questions", str(dag_run.root / "data" / "dev.jsonl"), "--out", str(out)],
                               capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    report = json.loads(out.read_text())
    assert sorted(report["backends"]) == ["node", "web"] and report["n_questions"] > 0
    for backend, figures in report["backends"].items():
        assert figures["windows_differing"] == 0, (backend, figures["first_differences"])
        assert figures["answer_agreement"] >= 0.99, (backend, figures["answers_differing"])


# An app's script on the installed package: one answer, and the backend whose runtime the app did not install.
APP_SCRIPT = """
import { loadBundle } from "distilqa-client/node";
const [bundle, question, context] = process.argv.slice(2);
const result = await (await loadBundle(bundle)).answer(question, context);
const web = await loadBundle(bundle, { backend: "web" }).then(() => null, (error) => `${error.name}: ${error.message}`);
const resolved = import.meta.resolve("distilqa-client/node");
console.log(JSON.stringify({ ...result, sliced: context.slice(result.start, result.end), web, resolved }));
"""


def test_the_packed_tarball_installs_in_a_fresh_project_and_answers_there(tiny, tmp_path):
    """`npm pack`, then a new project installs the tarball and onnxruntime-node (from the npm cache where it holds
    them) and answers with the package's Node entry point as the Python answerer does."""
    packed = subprocess.run([NPM, "pack", "--json", "--ignore-scripts", "--pack-destination", str(tmp_path)], cwd=CLIENT,
                            capture_output=True, text=True)
    assert packed.returncode == 0, packed.stderr[-2000:]
    tarball = tmp_path / json.loads(packed.stdout)[0]["filename"]
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "qa-app", "version": "1.0.0", "private": True,
                                                  "type": "module"}))
    runtime = json.loads((CLIENT / "package.json").read_text())["devDependencies"]["onnxruntime-node"]
    # onnxruntime-node's install script fetches GPU extras from a host outside the registry; the CPU binaries ship
    # in the package.
    env = {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip"}
    installed = subprocess.run([NPM, "install", "--prefer-offline", "--no-audit", "--no-fund", str(tarball),
                                f"onnxruntime-node@{runtime}"], cwd=app, env=env, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-2000:]
    package = app / "node_modules" / "distilqa-client"
    assert not package.is_symlink() and not (package / "test").exists() and (package / "types" / "node.d.ts").is_file()
    assert not (app / "node_modules" / "onnxruntime-web").exists()  # an optional peer: not installed unasked
    (app / "answer.mjs").write_text(APP_SCRIPT)
    # Emoji from the context's first character on: UTF-16 and code-point offsets part before any answer ends.
    question, context = {name: (q, c) for name, q, c in HARD_EXAMPLES}["emoji"]
    completed = subprocess.run([NODE, "answer.mjs", str(tiny["bundle"]), question, context], cwd=app,
                               capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout)
    assert result["resolved"].startswith(package.resolve().as_uri())
    python = answering.QuestionAnswerer.from_bundle(tiny["bundle"]).answer(question, context)
    assert result["answer"] == python["answer"] != ""
    assert [result["startCodePoint"], result["endCodePoint"]] == [python["start"], python["end"]]
    assert result["sliced"] == result["answer"] and result["end"] > result["endCodePoint"]
    assert result["web"].startswith('BundleError: backend "web" needs the package onnxruntime-web')


# --------------------------------------------------------------------------------------------- browser


def ask_in_the_demo_page(bundle_dir: Path, questions: list[dict], tmp_path: Path, *options: str) -> dict:
    """browser-check.mjs: the demo page in headless Chromium, served by the client's server, asked `questions`."""
    screenshot, out = tmp_path / "demo.png", tmp_path / "browser.json"
    command = [NODE, str(CLIENT / "scripts" / "browser-check.mjs"), "--bundle", str(bundle_dir), "--questions",
               str(write_questions(tmp_path / "q.json", questions)), "--out", str(out), "--screenshot", str(screenshot),
               *options]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-2000:]
    print(f"demo page screenshot: {screenshot}")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000
    return json.loads(out.read_text())


def bundle_and_questions(tiny) -> tuple[Path, list[dict], dict]:
    """A bundle, three dev questions and the torch-free answerer's answers to them (as the page shows them)."""
    bundle_dir, data_dir = tiny["bundle"], tiny["data"]
    if (DEFAULT_RUN / "bundle" / "qa_config.json").is_file() and (DEFAULT_RUN / "data" / "dev.jsonl").is_file():
        bundle_dir, data_dir = DEFAULT_RUN / "bundle", DEFAULT_RUN / "data"  # a trained model: real answers
    questions = dev_questions(data_dir)[:3]
    python = answering.QuestionAnswerer.from_bundle(bundle_dir)
    expected = {q["id"]: python.answer(q["question"], q["context"])["answer"] or "(no answer found)" for q in questions}
    return bundle_dir, questions, expected


@needs_chromium
def test_the_demo_page_is_cross_origin_isolated_and_answers_as_python_on_two_threads(tiny, tmp_path):
    bundle_dir, questions, expected = bundle_and_questions(tiny)
    shown = ask_in_the_demo_page(bundle_dir, questions, tmp_path, "--threads", "2")
    assert shown["page_errors"] == []
    assert shown["cross_origin_isolated"] is True
    # onnxruntime-web kept the 2 threads asked for (it falls back to 1 where it cannot) and started their worker.
    assert shown["threads"] == 2 and shown["workers"] >= 1
    assert "2 threads (cross-origin isolated)" in shown["status"]
    assert shown["answers"] == expected
    assert all(latency.endswith(" ms") for latency in shown["latency_ms"].values())
    size_mb = (bundle_dir / json.loads((bundle_dir / "qa_config.json").read_text())["onnx"]["model"]).stat().st_size / 1e6
    assert f"{size_mb:.2f} MB" in shown["model_size"]


@needs_chromium
def test_without_the_isolation_headers_the_page_runs_one_thread_and_says_why(tiny, tmp_path):
    bundle_dir, questions, expected = bundle_and_questions(tiny)
    shown = ask_in_the_demo_page(bundle_dir, questions, tmp_path, "--threads", "2", "--no-isolation")
    assert shown["cross_origin_isolated"] is False
    assert shown["threads"] == 1 and shown["workers"] == 0
    assert "1 thread (not cross-origin isolated" in shown["status"]
    assert shown["answers"] == expected  # still right, only slower


# ------------------------------------------------------------------------------------------- benchmark


def benchmark_root(tiny, tmp_path) -> Path:
    """An output root with what benchmark-web reads: the bundle and the student's config.json."""
    root = tmp_path / "artifacts"
    shutil.copytree(tiny["bundle"], root / "bundle")
    (root / "distill_squad").mkdir()
    shutil.copy(tiny["student"] / "config.json", root / "distill_squad" / "config.json")
    return root


def test_benchmark_web_times_the_bundle_model_on_both_node_runtimes(tiny, tmp_path):
    root = benchmark_root(tiny, tmp_path)
    out = tmp_path / "benchmark_web" / "benchmark_web.json"
    cfg = BenchmarkConfig(sequence_lengths=[32, 1024], runs=3, warmup=1, browser=False)
    metrics = benchmark_web.run(root, out, cfg)
    assert json.loads(out.read_text()) == metrics
    recipe = json.loads((root / "bundle" / "metrics.json").read_text())["onnx_variant"]
    assert [a["format"] for a in metrics["artifacts"]] == ["onnx-web", "onnx-node"]
    for item in metrics["artifacts"]:
        assert item["name"] == f"student/{item['format']}-int8-optimized" and item["precision"] == "int8-optimized"
        assert item["recipe"] == recipe
        assert item["size_mb"] > 0 and item["peak_rss_mib"] > 0
        timing = item["latency_ms"]["seq32"]["threads1"]
        assert 0 < timing["p50"] <= timing["p90"]
        assert item["latency_ms"]["seq1024"] is None  # beyond the model's positions
    assert metrics["machine"]["cpu"] and metrics["machine"]["cpu_flags"] is not None
    assert metrics["settings"]["threads"] == {"onnx-web": [1], "onnx-node": [1]}


@needs_chromium
def test_benchmark_web_times_the_bundle_model_in_chromium_at_one_and_two_threads(tiny, tmp_path):
    root = benchmark_root(tiny, tmp_path)
    cfg = BenchmarkConfig(sequence_lengths=[32, 1024], runs=3, warmup=1, browser_threads=[1, 2])
    metrics = benchmark_web.run(root, tmp_path / "benchmark_web.json", cfg)
    assert [a["format"] for a in metrics["artifacts"]] == ["onnx-web", "onnx-node", "onnx-web-chromium"]
    chromium = metrics["artifacts"][2]
    assert chromium["name"] == "student/onnx-web-chromium-int8-optimized"
    assert "in Chromium" in chromium["runtime"] and "cross-origin isolated" in chromium["runtime"]
    assert metrics["machine"]["browser"].startswith("Chromium ")
    for threads in ("threads1", "threads2"):
        timing = chromium["latency_ms"]["seq32"][threads]
        assert 0 < timing["p50"] <= timing["p90"]
    assert chromium["latency_ms"]["seq1024"] is None
    assert chromium["peak_rss_mib"] > 0  # the page's renderer process
    assert metrics["settings"]["threads"]["onnx-web-chromium"] == [1, 2]


@needs_chromium
def test_a_chromium_timing_that_cannot_run_the_threads_asked_for_is_an_error(tiny, tmp_path):
    out = tmp_path / "latency.json"
    model = tiny["bundle"] / json.loads((tiny["bundle"] / "qa_config.json").read_text())["onnx"]["model"]
    vocab_size = json.loads((tiny["student"] / "config.json").read_text())["vocab_size"]
    command = [NODE, str(CLIENT / "scripts" / "bench.mjs"), "--model", str(model), "--backend", "chromium",
               "--lengths", "32", "--vocab-size", str(vocab_size), "--runs", "1", "--warmup", "0", "--threads", "2",
               "--no-isolation", "--out", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert completed.returncode == 1 and "the page ran 1 thread where 2 were asked for" in completed.stderr
    assert not out.exists()


def test_benchmark_web_without_the_npm_packages_or_chromium_fails_clearly_when_they_are_required(tiny, tmp_path,
                                                                                                monkeypatch):
    root = benchmark_root(tiny, tmp_path)
    out = tmp_path / "benchmark_web.json"
    with pytest.raises(benchmark_web.WebBenchmarkError, match="node_modules/onnxruntime-node is missing: run `npm ci`"):
        benchmark_web.run(root, out, BenchmarkConfig(javascript=True, browser=False), client_dir=tmp_path / "no-client")
    monkeypatch.setenv("CHROMIUM_PATH", str(tmp_path / "no-chromium"))
    with pytest.raises(benchmark_web.WebBenchmarkError, match="no Chromium at .*no-chromium.*benchmark.browser is true"):
        benchmark_web.run(root, out, BenchmarkConfig(browser=True))
    assert not out.exists()
    shutil.rmtree(root / "bundle")
    with pytest.raises(benchmark_web.WebBenchmarkError, match="bundle/qa_config.json: missing"):
        benchmark_web.run(root, out, BenchmarkConfig(browser=False))


def test_benchmark_web_on_auto_times_what_the_machine_has_and_says_what_it_skipped(tiny, tmp_path, monkeypatch):
    root = benchmark_root(tiny, tmp_path)
    monkeypatch.setenv("CHROMIUM_PATH", str(tmp_path / "no-chromium"))
    cfg = BenchmarkConfig(sequence_lengths=[32], runs=2, warmup=0)  # javascript and browser: auto (the default)
    metrics = benchmark_web.run(root, tmp_path / "web.json", cfg)
    assert [a["format"] for a in metrics["artifacts"]] == ["onnx-web", "onnx-node"]
    assert [item["what"] for item in metrics["skipped"]] == ["Chromium timings (onnxruntime-web in a page)"]
    assert "no Chromium at" in metrics["skipped"][0]["reason"] and "no-chromium" in metrics["skipped"][0]["reason"]
    without_client = benchmark_web.run(root, tmp_path / "none.json", cfg, client_dir=tmp_path / "no-client")
    assert without_client["artifacts"] == []
    assert "onnxruntime-node is missing" in without_client["skipped"][0]["reason"]
    assert json.loads((tmp_path / "none.json").read_text()) == without_client