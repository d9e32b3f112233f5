"""Torch-free question answering on an app bundle: onnxruntime + tokenizers + numpy, nothing else (an OpenVINO
model, the bundle's x86 target, runs on the OpenVINO runtime instead: pipeline.runtime.openvino_session).

This module is the specification an app port (Swift, Kotlin, JavaScript) follows, step by step:
  1. Tokenize question and context as a pair with the bundle's tokenizer.json: question first, the context
     truncated into overlapping windows of `max_seq_length` tokens that share `doc_stride` tokens.
  2. Keep, per window, the character offsets of its context tokens (other tokens: none).
  3. Run the ONNX graph on one question's windows at a time (never batched with another question's), padded
     with the pad id to the longest of them, mask = 1 on real tokens (question_batches: why).
  4. In every window take the `n_best_size` best start and end positions; keep pairs that both lie in the
     context, end >= start and span at most `max_answer_length` tokens; score = start logit + end logit.
  5. The best pair over all windows is the answer; its text is cut from the original context by character
     offsets, so accents, case and spacing are the context's own.
Steps 4-5 are pipeline.runtime.squad.n_best_predictions, the same code the training stages evaluate with (numpy only).

`python -m pipeline answer --bundle DIR --question Q --context C` (or `--json FILE` for many questions).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from tokenizers import Tokenizer

from pipeline.errors import PipelineError
from pipeline.outputs.artifacts import atomic_write_text
from pipeline.outputs.manifests import ManifestError, verify_manifest
from pipeline.runtime import squad

CONTEXT_SEQUENCE_ID = 1  # question first, context second
NUMPY_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class BundleError(PipelineError, ValueError):
    """A bundle or an input file is incomplete or malformed; the message names the file and the field."""


@dataclass
class Windows:
    """Tokenized windows of several questions, right-padded to max_seq_length."""

    example_ids: list[str]
    input_ids: np.ndarray  # [windows, max_seq_length] int64
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    context_offsets: list[list[tuple[int, int] | None]]  # per window and position; None outside the context

    def __len__(self) -> int:
        return len(self.example_ids)


class QuestionAnswerer:
    """An ONNX question-answering model with its tokenizer and the SQuAD windowing and n-best settings."""

    def __init__(
        self,
        model_path: str | Path,
        tokenizer_path: str | Path,
        *,
        max_seq_length: int,
        doc_stride: int,
        n_best_size: int = 20,
        max_answer_length: int = 30,
        batch_size: int = 16,
        threads: int | None = None,
    ):
        if not 0 <= doc_stride < max_seq_length:
            raise BundleError(f"doc_stride {doc_stride} must be in [0, max_seq_length={max_seq_length})")
        self.max_seq_length, self.doc_stride = max_seq_length, doc_stride
        self.n_best_size, self.max_answer_length, self.batch_size = n_best_size, max_answer_length, batch_size
        self._load_tokenizer(tokenizer_path)
        options = onnxruntime.SessionOptions()
        if threads:  # pinned for reproducible timings; None lets onnxruntime use every core
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session = _open_session(model_path, options, threads)
        unknown = {i.name for i in self.session.get_inputs()} - {"input_ids", "attention_mask", "token_type_ids"}
        if unknown:
            raise BundleError(f"{model_path}: unexpected model inputs {sorted(unknown)}")

    @classmethod
    def with_squad_settings(cls, model_path, tokenizer_path, squad_settings, threads: int | None = None):
        """An answerer with the windowing and n-best settings of a config's `squad` section."""
        return cls(model_path, tokenizer_path, max_seq_length=squad_settings.max_seq_length,
                   doc_stride=squad_settings.doc_stride, n_best_size=squad_settings.n_best_size,
                   max_answer_length=squad_settings.max_answer_length, threads=threads)

    def _load_tokenizer(self, tokenizer_path: str | Path) -> None:
        self.question_tokenizer = _read_tokenizer(tokenizer_path)  # counts question tokens, never truncates
        self.question_tokenizer.no_truncation()
        self.question_tokenizer.no_padding()
        self.tokenizer = _read_tokenizer(tokenizer_path)
        self.tokenizer.no_padding()  # windows are padded here, explicitly
        self.tokenizer.enable_truncation(
            max_length=self.max_seq_length, stride=self.doc_stride, strategy="only_second", direction="right"
        )
        self.pad_id = _pad_id(self.tokenizer, tokenizer_path)

    @classmethod
    def from_bundle(
        cls, bundle_dir: str | Path, model: str | None = None, threads: int | None = None, verify: bool = True
    ) -> "QuestionAnswerer":
        """Open an app bundle (qa_config.json + tokenizer + ONNX model), refusing files that differ from its manifest."""
        bundle_dir = Path(bundle_dir)
        if verify:
            try:
                verify_manifest(bundle_dir)
            except ManifestError as error:
                raise BundleError(str(error)) from None
        config = read_qa_config(bundle_dir / "qa_config.json")
        model_file = model or config["onnx"]["model"]
        return cls(
            bundle_dir / model_file,
            bundle_dir / config["tokenizer"]["file"],
            max_seq_length=config["max_seq_length"],
            doc_stride=config["doc_stride"],
            n_best_size=config["n_best_size"],
            max_answer_length=config["max_answer_length"],
            threads=threads,
        )

    # -------------------------------------------------------------------------------------- 1-3: windows

    def windows(self, examples: list[dict[str, str]]) -> Windows:
        """Every window of every example ({"id", "question", "context"}), in example order."""
        example_ids, rows, offsets = [], [], []
        for example in examples:
            # Leading whitespace in a question only wastes window room (as in training).
            encoding = self._encode(example["question"].lstrip(), example["context"], example["id"])
            for window in [encoding] + list(encoding.overflowing):
                example_ids.append(example["id"])
                rows.append((window.ids, window.type_ids))
                context_offsets = [
                    tuple(offset) if sequence_id == CONTEXT_SEQUENCE_ID else None
                    for offset, sequence_id in zip(window.offsets, window.sequence_ids)
                ]
                offsets.append(context_offsets + [None] * (self.max_seq_length - len(context_offsets)))
        n = len(rows)
        input_ids = np.full((n, self.max_seq_length), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((n, self.max_seq_length), dtype=np.int64)
        token_type_ids = np.zeros((n, self.max_seq_length), dtype=np.int64)
        for row, (ids, type_ids) in enumerate(rows):
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
            token_type_ids[row, : len(ids)] = type_ids
        return Windows(example_ids, input_ids, attention_mask, token_type_ids, offsets)

    def _encode(self, question: str, context: str, example_id: str):
        # A context cut into windows needs room for more context than the stride shares, or tokenizers cannot
        # window it (it panics): refuse such a question up front, by id. A pair that fits in one window is fine.
        question_tokens = len(self.question_tokenizer.encode(question, add_special_tokens=False).ids)
        room = self.max_seq_length - question_tokens - self.tokenizer.num_special_tokens_to_add(is_pair=True)
        context_tokens = len(self.question_tokenizer.encode(context, add_special_tokens=False).ids)
        if room <= self.doc_stride and context_tokens > room:
            raise BundleError(
                f"question {example_id!r}: {question_tokens} tokens leave {room} for the context in a window of "
                f"{self.max_seq_length}, not more than doc_stride {self.doc_stride}; the question is too long"
            )
        return self.tokenizer.encode(question, context)

    def window_logits(self, windows: Windows) -> tuple[np.ndarray, np.ndarray]:
        return window_logits(self.session, windows, self.batch_size)

    # ------------------------------------------------------------------------------------ 4-5: answers

    def n_best(self, examples: list[dict[str, str]], windows: Windows | None = None) -> dict[str, list[dict[str, Any]]]:
        """Question id -> candidate answers, best first: {"text", "start", "end", "score", "start_logit", "end_logit"}.

        `windows`: these examples' windows from `windows()` of an answerer with the same tokenizer and settings
        (several models scored on the same questions tokenize them once)."""
        _check_unique_ids(examples)
        _check_not_blank(examples)
        windows = self.windows(examples) if windows is None else windows
        start_logits, end_logits = self.window_logits(windows)
        return squad.n_best_predictions(
            {"id": [e["id"] for e in examples], "context": [e["context"] for e in examples]},
            {"example_id": windows.example_ids, "offset_mapping": windows.context_offsets},
            start_logits, end_logits, n_best_size=self.n_best_size, max_answer_length=self.max_answer_length,
        )

    def predict(self, examples: list[dict[str, str]], windows: Windows | None = None) -> dict[str, str]:
        """Question id -> answer text ("" when no window holds a valid span); `windows` as for n_best."""
        return {qid: (candidates[0]["text"] if candidates else "")
                for qid, candidates in self.n_best(examples, windows).items()}

    def answer(self, question: str, context: str, n_best: int = 5) -> dict[str, Any]:
        """One question: {"answer", "start", "end", "score", "n_best": [...]} (start/end are character offsets)."""
        blank = _blank_field({"question": question, "context": context})
        if blank:
            raise BundleError(f"the {blank} is empty: there is nothing to answer")
        candidates = self.n_best([{"id": "q", "question": question, "context": context}])["q"]
        best = candidates[0] if candidates else {"text": "", "start": 0, "end": 0, "score": None}
        return {"answer": best["text"], "start": best["start"], "end": best["end"], "score": best["score"],
                "n_best": candidates[:n_best]}


def question_batches(windows: Windows, batch_size: int) -> list[slice]:
    """Row ranges of the model calls: each question's own windows (consecutive rows), up to batch_size a call,
    never another question's. A dynamic int8 graph computes its activation scales over the whole input, so a
    window batched with other questions' windows (or padded to their length) would get an answer that depends on
    them; this way a question's logits are the same alone, first, last or among others, and the gates score the
    computation an app answering one question runs."""
    batches, begin = [], 0
    for row in range(1, len(windows) + 1):
        if row == len(windows) or windows.example_ids[row] != windows.example_ids[begin] or row - begin == batch_size:
            batches.append(slice(begin, row))
            begin = row
    return batches


def window_logits(session, windows: Windows, batch_size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits [windows, max_seq_length], one question's windows a call (question_batches), each
    call padded to its longest window; positions past it get -1e4."""
    input_types = {i.name: NUMPY_DTYPES.get(i.type, np.int64) for i in session.get_inputs()}
    arrays = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
              "token_type_ids": windows.token_type_ids}
    starts = np.full(windows.input_ids.shape, -1e4, dtype=np.float32)
    ends = np.full(windows.input_ids.shape, -1e4, dtype=np.float32)
    for rows in question_batches(windows, batch_size):
        # Run only up to the longest window of the call: padding costs compute.
        length = int(windows.attention_mask[rows].sum(axis=1).max())
        feed = {name: arrays[name][rows, :length].astype(dtype) for name, dtype in input_types.items()}
        start_logits, end_logits = session.run(["start_logits", "end_logits"], feed)
        starts[rows, :length], ends[rows, :length] = start_logits, end_logits
    return starts, ends


def _read_tokenizer(tokenizer_path: str | Path) -> Tokenizer:
    if not Path(tokenizer_path).is_file():
        raise BundleError(f"{tokenizer_path}: tokenizer file not found")
    try:
        return Tokenizer.from_file(str(tokenizer_path))
    except Exception as error:  # tokenizers raises a bare Exception on malformed JSON
        raise BundleError(f"{tokenizer_path}: not a tokenizers JSON file ({str(error).splitlines()[0]})") from None


def _open_session(model_path: str | Path, options: onnxruntime.SessionOptions, threads: int | None = None):
    """An onnxruntime session on the CPU, or for an OpenVINO model (.xml) an OpenVinoSession with `threads`; a
    missing, truncated or corrupted model file is a BundleError naming it."""
    if not Path(model_path).is_file():
        raise BundleError(f"{model_path}: model file not found")
    openvino = Path(model_path).suffix == ".xml"
    if openvino and importlib.util.find_spec("openvino") is None:
        raise BundleError(f"{model_path}: an OpenVINO model needs the openvino package (pip install openvino)")
    try:
        if openvino:
            from pipeline.runtime.openvino_session import OpenVinoSession

            return OpenVinoSession(model_path, threads)
        return onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own Fail/InvalidProtobuf/InvalidGraph types, OpenVINO its own
        # OpenVINO's messages open with the source file that raised: the first other line says what is wrong
        lines = [line for line in str(error).splitlines() if line.strip() and not line.startswith("Exception from")]
        reason = lines[0] if lines else type(error).__name__
        kind = "OpenVINO" if openvino else "ONNX"
        raise BundleError(f"{model_path}: not a loadable {kind} model ({reason})") from None


def _pad_id(tokenizer: Tokenizer, tokenizer_path) -> int:
    pad_id = tokenizer.token_to_id("[PAD]")
    if pad_id is None:
        raise BundleError(f"{tokenizer_path}: the vocabulary has no [PAD] token")
    return pad_id


def _blank_field(example: dict[str, str]) -> str | None:
    """"question" or "context" when that one is empty or all whitespace: a span found there would not answer."""
    for field in ("question", "context"):
        if not example[field].strip():
            return field
    return None


def _check_not_blank(examples: list[dict[str, str]]) -> None:
    for example in examples:
        blank = _blank_field(example)
        if blank:
            raise BundleError(f"question {example['id']!r}: the {blank} is empty")


def _check_unique_ids(examples: list[dict[str, str]]) -> None:
    seen = set()
    for example in examples:
        if example["id"] in seen:
            raise BundleError(f"question id {example['id']!r} appears twice")
        seen.add(example["id"])


# ---------------------------------------------------------------------------------------------- bundle files

QA_CONFIG_KEYS = ("max_seq_length", "doc_stride", "n_best_size", "max_answer_length", "tokenizer", "onnx")


def read_qa_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BundleError(f"{path}: missing (not an app bundle?)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise BundleError(f"{path}: invalid JSON at line {error.lineno}: {error.msg}") from None
    missing = [key for key in QA_CONFIG_KEYS if key not in config]
    if missing:
        raise BundleError(f"{path}: missing keys {missing}")
    return config


def read_questions(path: Path) -> list[dict[str, str]]:
    """Questions from a JSON list of {"id", "question", "context"}, or a SQuAD v1.1/v2.0 file; a field of the
    wrong type, a blank question or context and a repeated id are BundleErrors naming the file and where."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{path}: file not found") from None
    except json.JSONDecodeError as error:
        raise BundleError(f"{path}: invalid JSON at line {error.lineno}: {error.msg}") from None
    if isinstance(data, dict) and "data" in data:
        records = list(_squad_records(data["data"], path))
    elif isinstance(data, list):
        records = [(f"question {index}", record) for index, record in enumerate(data)]
    else:
        raise BundleError(f"{path}: expected a list of {{id, question, context}} objects or a SQuAD file")
    if not records:
        raise BundleError(f"{path}: no questions in the file")
    questions, seen = [], set()
    for where, record in records:
        for field in ("id", "question", "context"):
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise BundleError(f"{path}: {where}: field {field!r} must be a string")
        blank = _blank_field(record)
        if blank:
            raise BundleError(f"{path}: question {record['id']!r}: the {blank} is empty")
        if record["id"] in seen:
            raise BundleError(f"{path}: question id {record['id']!r} appears twice")
        seen.add(record["id"])
        questions.append({"id": record["id"], "question": record["question"], "context": record["context"]})
    return questions


def _squad_records(articles: Any, path: Path):
    """(where, {"id", "question", "context"}) of each question of a SQuAD file's `data`, its layout checked on the
    way: articles -> paragraphs -> context and qas."""

    def expect(value: Any, kind: type, where: str) -> Any:
        if not isinstance(value, kind):
            expected = {list: "a list", dict: "an object", str: "a string"}[kind]
            raise BundleError(f"{path}: {where}: expected {expected}, got {_json_type(value)}")
        return value

    for a, article in enumerate(expect(articles, list, "data")):
        article = expect(article, dict, f"data[{a}]")
        for p, paragraph in enumerate(expect(article.get("paragraphs"), list, f"data[{a}].paragraphs")):
            where = f"data[{a}].paragraphs[{p}]"
            paragraph = expect(paragraph, dict, where)
            context = expect(paragraph.get("context"), str, f"{where}.context")
            for q, qa in enumerate(expect(paragraph.get("qas"), list, f"{where}.qas")):
                qa = expect(qa, dict, f"{where}.qas[{q}]")
                yield f"{where}.qas[{q}]", {"id": qa.get("id"), "question": qa.get("question"), "context": context}


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, as a message to a JSON file's author says it."""
    if value is None:
        return "nothing (missing or null)"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline answer",
        description="Answer questions with an app bundle, torch-free (onnxruntime + tokenizers + numpy).",
    )
    parser.add_argument("--bundle", required=True, type=Path, help="folder written by the bundle rule")
    parser.add_argument("--question", help="one question (with --context)")
    parser.add_argument("--context", help="the text to answer from")
    parser.add_argument("--json", type=Path, help="many questions: a JSON list of {id, question, context} or SQuAD file")
    parser.add_argument("--out", type=Path, help="with --json: write {id: answer} here instead of stdout")
    parser.add_argument("--model", help="another model of the bundle: an ONNX or .ort file, or the x86 target "
                        "openvino/openvino_model.xml (default: qa_config.json's onnx.model)")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads of the runtime")
    args = parser.parse_args(argv)
    if (args.json is None) == (args.question is None or args.context is None):
        parser.error("give --question and --context, or --json")
    try:
        questions = read_questions(args.json) if args.json is not None else None  # bad input before the model loads
        answerer = QuestionAnswerer.from_bundle(args.bundle, model=args.model, threads=args.threads)
        if questions is not None:
            text = json.dumps(answerer.predict(questions), ensure_ascii=False, indent=1)
            if args.out:
                atomic_write_text(args.out, text + "\n")  # a killed run leaves no answers file that looks complete
            else:
                print(text)
        else:
            print(json.dumps(answerer.answer(args.question, args.context), ensure_ascii=False))
    except BundleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
