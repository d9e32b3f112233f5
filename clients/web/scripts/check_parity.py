"""Parity of the JavaScript client with the torch-free Python answerer (pipeline.runtime.answering) on one bundle and question
file.

Runs `node scripts/parity.mjs` on each backend, then compares with the Python answerer on the same questions:
  * token ids, token types and context offsets of every window of every question (must be identical; the token
    types are what BERT, ELECTRA and MobileBERT graphs take as token_type_ids),
  * answer text per question (share of questions with the same text as `python -m pipeline answer --json`),
  * the answer's span: the client's code-point offsets (startCodePoint/endCodePoint) against the Python
    answerer's start/end (Python str indices), and its UTF-16 offsets (start/end, JavaScript string indices)
    checked here by slicing the context's UTF-16 encoding (must give the answer text, every time).
Prints the figures, writes them as JSON with --out, and exits 1 when a window differs, a UTF-16 span does not
give its answer, or the answer or span agreement is below --min-agreement.

  .venv/bin/python clients/web/scripts/check_parity.py --bundle artifacts/bundle --questions artifacts/data/dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.runtime import answering

CLIENT_DIR = Path(__file__).resolve().parents[1]


def read_questions(path: Path) -> list[dict[str, str]]:
    """JSON lines (the pipeline's dev.jsonl) or whatever `python -m pipeline answer --json` reads."""
    if path.suffix != ".jsonl":
        return answering.read_questions(path)
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            record = json.loads(line)
            questions.append({"id": record["id"], "question": record["question"], "context": record["context"]})
    return questions


def run_javascript(bundle: Path, questions: Path, backend: str, tokenizer: str = "json") -> dict:
    node_modules = CLIENT_DIR / "node_modules"
    if not node_modules.is_dir():
        raise SystemExit(f"error: {node_modules} is missing: run `npm ci` in {CLIENT_DIR}")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "js.json"
        command = ["node", str(CLIENT_DIR / "scripts" / "parity.mjs"), "--bundle", str(bundle), "--questions",
                   str(questions), "--out", str(out), "--backend", backend, "--tokenizer", tokenizer]
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0:
            raise SystemExit(f"error: {' '.join(command)} failed: {completed.stderr.strip()}")
        return json.loads(out.read_text(encoding="utf-8"))


def compare_windows(python_windows: answering.Windows, js_windows: list[dict]) -> dict:
    """Windows whose ids, token types or context offsets differ, with the first difference of each (at most 5
    listed)."""
    differences = []
    if len(js_windows) != len(python_windows):
        differences.append(f"{len(js_windows)} JavaScript windows, {len(python_windows)} Python windows")
    for index, js in enumerate(js_windows[: len(python_windows)]):
        length = int(python_windows.attention_mask[index].sum())
        ids = python_windows.input_ids[index, :length].tolist()
        offsets = [list(o) if o is not None else None for o in python_windows.context_offsets[index][:length]]
        if js["example_id"] != python_windows.example_ids[index]:
            differences.append(f"window {index}: question {js['example_id']!r}, expected {python_windows.example_ids[index]!r}")
        elif js["input_ids"] != ids:
            differences.append(f"window {index} ({js['example_id']}): token ids differ")
        elif js["token_type_ids"] != python_windows.token_type_ids[index, :length].tolist():
            differences.append(f"window {index} ({js['example_id']}): token types differ")
        elif js["context_offsets"] != offsets:
            differences.append(f"window {index} ({js['example_id']}): context offsets differ")
    return {"windows": len(python_windows), "windows_differing": len(differences), "first_differences": differences[:5]}


def utf16_slice(text: str, start: int, end: int) -> str:
    """text between two JavaScript string indices (UTF-16 code units), as String.prototype.slice cuts it."""
    return text.encode("utf-16-le")[2 * start:2 * end].decode("utf-16-le")


def compare_spans(contexts: dict[str, str], python_n_best: dict[str, list[dict]], js: dict) -> dict:
    """The best answer's offsets: code points against the Python answerer's, UTF-16 ones against the context."""
    same, differing, utf16_wrong, utf16_moved = 0, [], [], 0
    for qid, candidates in python_n_best.items():
        python_span = [candidates[0]["start"], candidates[0]["end"]] if candidates else None
        span = js["spans"].get(qid)
        js_span = [span["start_code_point"], span["end_code_point"]] if span else None
        if js_span == python_span:
            same += 1
        else:
            differing.append({"id": qid, "python": python_span, "javascript": js_span})
        if span is None:
            continue
        if utf16_slice(contexts[qid], span["start"], span["end"]) != js["predictions"][qid]:
            utf16_wrong.append({"id": qid, "start": span["start"], "end": span["end"], "answer": js["predictions"][qid]})
        utf16_moved += [span["start"], span["end"]] != js_span
    return {"answer_spans_same": same, "answer_spans_differing": differing[:10], "utf16_spans_wrong": utf16_wrong[:10],
            # answers behind a character outside the Basic Multilingual Plane: UTF-16 and code points part there
            "utf16_spans_unlike_code_points": utf16_moved}


def parity(bundle: Path, questions_path: Path, backends: list[str], tokenizer: str = "json") -> dict:
    questions = read_questions(questions_path)
    answerer = answering.QuestionAnswerer.from_bundle(bundle, threads=1)
    python_windows = answerer.windows(questions)
    python_n_best = answerer.n_best(questions, python_windows)
    python_answers = {qid: (candidates[0]["text"] if candidates else "") for qid, candidates in python_n_best.items()}
    contexts = {q["id"]: q["context"] for q in questions}
    report = {"bundle": str(bundle), "questions": str(questions_path), "n_questions": len(questions),
              "n_contexts": len({q["context"] for q in questions}), "backends": {}}
    for backend in backends:
        js = run_javascript(bundle, questions_path, backend, tokenizer)
        same = [qid for qid, text in python_answers.items() if js["predictions"].get(qid) == text]
        differing = [{"id": qid, "python": text, "javascript": js["predictions"].get(qid)}
                     for qid, text in python_answers.items() if js["predictions"].get(qid) != text]
        report["backends"][backend] = {
            "answer_agreement": round(len(same) / max(len(questions), 1), 4),
            "answers_same": len(same),
            "answers_differing": differing[:10],
            **compare_spans(contexts, python_n_best, js),
            **compare_windows(python_windows, js["windows"]),
            "javascript_seconds": round(js["seconds"], 3),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--questions", type=Path, required=True, help="dev.jsonl, a JSON list or a SQuAD file")
    parser.add_argument("--backends", nargs="+", default=["node", "web"], choices=["node", "web"])
    parser.add_argument("--tokenizer", default="json", choices=["json", "vocab"],
                        help="the JavaScript client reads tokenizer.json or vocab.txt")
    parser.add_argument("--min-agreement", type=float, default=0.99)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    try:
        report = parity(args.bundle, args.questions, args.backends, args.tokenizer)
    except answering.BundleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = json.dumps(report, ensure_ascii=False, indent=1)
    if args.out:
        partial = args.out.with_name(args.out.name + ".partial")
        partial.write_text(text + "\n", encoding="utf-8")
        os.replace(partial, args.out)
    print(text)
    n = max(report["n_questions"], 1)
    ok = all(b["windows_differing"] == 0 and not b["utf16_spans_wrong"] and b["answer_agreement"] >= args.min_agreement
             and b["answer_spans_same"] / n >= args.min_agreement for b in report["backends"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
