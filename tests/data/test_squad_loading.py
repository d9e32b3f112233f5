"""pipeline.data.squad_loading: SQuAD files load into the hub "squad" columns, and bad data fails with a message
that points at it."""

import json
import logging

import datasets
import pytest

from pipeline.data.squad_loading import DataError, LoadReport, load_squad
from pipeline.plan.config import PipelineConfig, from_dict
from pipeline.plan.data_sources import MissingSourceError, check_local_files, looks_like_a_path

PARIS_CONTEXT = "Paris is the capital of France. Lyon is the third city."  # "France" at 24, "Lyon" at 32


def squad_question(question_id, question, answers, **extra):
    """One entry of a paragraph's "qas" in the official file layout; answers as (text, answer_start) pairs."""
    qa = {"id": question_id, "question": question, "answers": [{"text": t, "answer_start": s} for t, s in answers]}
    qa.update(extra)
    return qa


def squad_document(qas, context=PARIS_CONTEXT, version="1.1", title="France"):
    """A one-article, one-paragraph SQuAD file."""
    return {"version": version, "data": [{"title": title, "paragraphs": [{"context": context, "qas": qas}]}]}


def write_json(path, document):
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return str(path)


def column_record(question_id, answers, context=PARIS_CONTEXT, question="What?"):
    """One record in the column layout (JSON Lines / hub rows)."""
    return {
        "id": question_id,
        "title": "France",
        "context": context,
        "question": question,
        "answers": {"text": [t for t, _ in answers], "answer_start": [s for _, s in answers]},
    }


GOOD_QAS = [
    squad_question("q1", "What is the capital of France?", [("Paris", 0)]),
    squad_question("q2", "Where is Paris?", [("France", 24), ("France.", 24)]),
]


# --------------------------------------------------------------------------------------------- good files


def test_squad_v1_json_loads_into_the_hub_squad_columns(tmp_path):
    dataset, report = load_squad(write_json(tmp_path / "train.json", squad_document(GOOD_QAS)))

    assert dataset.column_names == ["id", "title", "context", "question", "answers"]
    assert dataset[1] == {
        "id": "q2",
        "title": "France",
        "context": PARIS_CONTEXT,
        "question": "Where is Paris?",
        "answers": {"text": ["France", "France."], "answer_start": [24, 24]},
    }
    assert report == LoadReport(
        source=str(tmp_path / "train.json"), n_examples=2, n_unanswerable_excluded=0, n_skipped=0, skipped_reasons=[]
    )


def test_squad_v2_json_excludes_and_counts_unanswerable_questions(tmp_path, caplog):
    qas = [
        squad_question("q1", "What is the capital of France?", [("Paris", 0)], is_impossible=False),
        squad_question("q2", "What is the capital of Spain?", [], is_impossible=True),
        squad_question("q3", "Who founded Lyon?", []),  # empty answers in a v2 file also means unanswerable
    ]
    source = write_json(tmp_path / "dev.json", squad_document(qas, version="v2.0"))

    with caplog.at_level(logging.INFO, logger="pipeline.data.squad_loading"):
        dataset, report = load_squad(source)

    assert dataset["id"] == ["q1"]
    assert (report.n_examples, report.n_unanswerable_excluded, report.n_skipped) == (1, 2, 0)
    assert "excluded 2 unanswerable" in caplog.text


def test_jsonl_loads_one_record_per_line_and_ignores_blank_lines(tmp_path):
    records = [column_record("a", [("Paris", 0)]), column_record("b", [("Lyon", 32)])]
    source = write_jsonl(tmp_path / "train.jsonl", records)
    with open(source, "a", encoding="utf-8") as file:
        file.write("\n")

    dataset, report = load_squad(source)

    assert dataset["id"] == ["a", "b"]
    assert dataset[1]["answers"] == {"text": ["Lyon"], "answer_start": [32]}
    assert report.n_examples == 2


def test_real_squad2_dev_sample_keeps_the_473_answerable_of_950_questions(squad2_dev_sample):
    dataset, report = load_squad(str(squad2_dev_sample), split="validation")

    assert (report.n_examples, report.n_unanswerable_excluded, report.n_skipped) == (473, 477, 0)
    assert len(dataset) == 473
    assert len(set(dataset["title"])) == 3
    assert max(len(answers["text"]) for answers in dataset["answers"]) > 1  # dev sets have several gold answers


def test_hub_rows_go_through_the_same_validation(monkeypatch):
    rows = [
        dict(column_record("good", [("Paris", 0)]), extra_column=1),
        dict(column_record("unanswerable", []), extra_column=2),  # how the hub's squad_v2 marks them
        dict(column_record("bad", [("Paris", 5)]), extra_column=3),
    ]
    requested = {}

    def offline_load_dataset(name, split, cache_dir):
        requested.update(name=name, split=split, cache_dir=cache_dir)
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", offline_load_dataset)

    dataset, report = load_squad("rajpurkar/squad_v2", split="validation", on_bad_example="skip", cache_dir="/c")

    assert requested == {"name": "rajpurkar/squad_v2", "split": "validation", "cache_dir": "/c"}
    assert dataset.column_names == ["id", "title", "context", "question", "answers"]
    assert dataset["id"] == ["good"]
    assert (report.n_unanswerable_excluded, report.n_skipped) == (1, 1)
    assert report.skipped_reasons == [
        "rajpurkar/squad_v2: row 2, example 'bad' field 'answers.answer_start': answer_start 5 does not point at "
        "the answer text 'Paris' (context has ' is t' there)"
    ]


# ----------------------------------------------------------------------------------------- bad files, error mode


def test_missing_file_is_reported_without_asking_the_hub(tmp_path):
    with pytest.raises(DataError, match=r"data/nowhere\.json: file not found"):
        load_squad("data/nowhere.json")
    with pytest.raises(DataError, match="file not found"):
        load_squad(str(tmp_path / "missing" / "train"))  # an absolute path without a suffix is still a path


def test_every_missing_local_path_of_the_config_is_named_with_its_key(tmp_path):
    present = tmp_path / "corpus.txt"
    present.write_text("a document\n")
    cfg = from_dict(PipelineConfig, {"data": {"squad": str(tmp_path / "train.json"), "squad_dev": "dev.jsonl",
                                              "corpus": str(present)},
                                     "teacher": {"pretrained": "./teachers/bert"},
                                     "student": {"pretrained": str(tmp_path / "students" / "small")},
                                     "export": {"full_size": {"distilbert_pretrained": "distilbert-base-uncased"}}})
    with pytest.raises(MissingSourceError) as raised:
        check_local_files(cfg)
    message = str(raised.value)
    assert f"data.squad: {tmp_path / 'train.json'}" in message and "data.squad_dev: dev.jsonl" in message
    assert "teacher.pretrained: ./teachers/bert" in message and "student.pretrained: " in message
    assert "data.corpus" not in message and "distilbert" not in message  # present, and a hub name
    check_local_files(from_dict(PipelineConfig, {}))  # the offline default names no file


def test_paths_and_hub_names_are_told_apart():
    assert looks_like_a_path("train.jsonl") and looks_like_a_path("./squad") and looks_like_a_path("a/b/c")
    assert not looks_like_a_path("squad") and not looks_like_a_path("rajpurkar/squad")


def test_invalid_json_reports_line_and_column(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('{"version": "1.1",\n "data": [}', encoding="utf-8")

    with pytest.raises(DataError, match=r"train\.json: invalid JSON at line 2 column 11"):
        load_squad(str(path))


def test_json_lines_saved_as_json_gets_a_hint(tmp_path):
    source = write_jsonl(tmp_path / "train.json", [column_record("a", [("Paris", 0)])] * 2)

    with pytest.raises(DataError, match="if this is JSON Lines, name it .jsonl"):
        load_squad(source)


def test_invalid_jsonl_reports_the_line_number(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(column_record("a", [("Paris", 0)])) + '\n{"id": "b", oops}\n', encoding="utf-8")

    with pytest.raises(DataError, match=r"train\.jsonl: line 2: invalid JSON"):
        load_squad(str(path), on_bad_example="skip")  # a broken file is never skipped


def test_file_without_squad_layout_is_rejected(tmp_path):
    with pytest.raises(DataError, match="field 'data'"):
        load_squad(write_json(tmp_path / "train.json", [{"context": "x"}]))


def test_missing_paragraph_key_names_the_article_and_paragraph(tmp_path):
    document = {"version": "1.1", "data": [{"title": "France", "paragraphs": [{"qas": GOOD_QAS}]}]}

    with pytest.raises(DataError, match=r"train\.json: article 'France' paragraph 0 field 'context': missing key"):
        load_squad(write_json(tmp_path / "train.json", document))


@pytest.mark.parametrize(
    ("bad_qa", "expected_message"),
    [
        (
            {"id": "q17", "answers": [{"text": "Paris", "answer_start": 0}]},
            "example 'q17' field 'question': missing key",
        ),
        (
            {"id": "q17", "question": "Capital?", "answers": [{"text": "Paris"}]},
            r"example 'q17' field 'answers\[0\]\.answer_start': missing key",
        ),
        (
            squad_question("q17", "   ", [("Paris", 0)]),
            "example 'q17' field 'question': empty question",
        ),
        (
            squad_question("q17", "Capital?", [("Paris", 60)]),
            "example 'q17' field 'answers.answer_start': answer_start 60 with answer length 5 is outside the context",
        ),
        (
            squad_question("q17", "Capital?", [("Paris", "0")]),
            "example 'q17' field 'answers.answer_start': expected an integer, got '0'",
        ),
        (
            squad_question("q17", "Capital?", [("Paris", 32)]),
            "example 'q17' field 'answers.answer_start': answer_start 32 does not point at the answer text "
            "'Paris' \\(context has 'Lyon ' there\\)",
        ),
        (
            # Dev sets have several gold answers: one bad answer makes the whole example bad.
            squad_question("q17", "Capital?", [("Paris", 0), ("Paris", 1)]),
            "example 'q17' field 'answers.answer_start': answer 1: answer_start 1 does not point",
        ),
        (
            squad_question("q17", "Capital?", []),
            "example 'q17' field 'answers': no answers",
        ),
        (
            squad_question("q1", "Again?", [("Paris", 0)]),
            "example 'q1' field 'id': duplicate id",
        ),
    ],
)
def test_bad_example_in_error_mode_names_file_example_and_field(tmp_path, bad_qa, expected_message):
    source = write_json(tmp_path / "train.json", squad_document([GOOD_QAS[0], bad_qa]))

    with pytest.raises(DataError, match=r"train\.json: " + expected_message):
        load_squad(source)


def test_empty_context_is_reported_for_its_example(tmp_path):
    source = write_json(tmp_path / "train.json", squad_document([squad_question("q5", "Why?", [])], context=" "))

    with pytest.raises(DataError, match=r"train\.json: example 'q5' field 'context': empty context"):
        load_squad(source)


def test_jsonl_errors_name_line_example_and_field(tmp_path):
    records = [column_record("a", [("Paris", 0)]), column_record("b", [("Paris", 0)], question="")]
    records.append({key: value for key, value in column_record("c", [("Paris", 0)]).items() if key != "context"})
    source = write_jsonl(tmp_path / "train.jsonl", records)

    with pytest.raises(DataError, match=r"train\.jsonl: line 2, example 'b' field 'question': empty question"):
        load_squad(source)

    record_with_mismatch = column_record("d", [("Paris", 0)])
    record_with_mismatch["answers"]["answer_start"].append(3)
    source = write_jsonl(tmp_path / "mismatch.jsonl", [record_with_mismatch])
    with pytest.raises(DataError, match="example 'd' field 'answers': 1 answer texts but 2 answer_start values"):
        load_squad(source)


# ------------------------------------------------------------------------------------------------ skip mode


def test_skip_mode_drops_and_counts_bad_examples_and_keeps_the_first_reasons(tmp_path, caplog):
    records = [
        column_record("good", [("Paris", 0)]),
        column_record("moved", [("Paris", 32)]),
        column_record("empty", [("Paris", 0)], context=""),
        column_record("also-good", [("Lyon", 32)]),
    ]
    records.append({key: value for key, value in column_record("no-title", [("Paris", 0)]).items() if key != "title"})
    source = write_jsonl(tmp_path / "train.jsonl", records)

    with caplog.at_level(logging.WARNING, logger="pipeline.data.squad_loading"):
        dataset, report = load_squad(source, on_bad_example="skip")

    assert dataset["id"] == ["good", "also-good"]
    assert (report.n_examples, report.n_skipped) == (2, 3)
    assert "line 2, example 'moved' field 'answers.answer_start'" in report.skipped_reasons[0]
    assert "field 'context': empty context" in report.skipped_reasons[1]
    assert "line 5, example 'no-title' field 'title': missing key" in report.skipped_reasons[2]
    assert "skipped 3 bad examples" in caplog.text


def test_skip_mode_on_a_squad_json_file(tmp_path):
    qas = GOOD_QAS + [squad_question("bad", "Capital?", [("Paris", 3)])]

    dataset, report = load_squad(write_json(tmp_path / "train.json", squad_document(qas)), on_bad_example="skip")

    assert dataset["id"] == ["q1", "q2"]
    assert report.n_skipped == 1


def test_a_file_with_nothing_usable_is_an_error(tmp_path):
    source = write_json(tmp_path / "train.json", squad_document([squad_question("bad", "Capital?", [("Paris", 3)])]))

    with pytest.raises(DataError, match=r"train\.json: no answerable examples left .*1 bad examples skipped"):
        load_squad(source, on_bad_example="skip")


def test_unknown_on_bad_example_value_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="on_bad_example must be one of .* got 'ignore'"):
        load_squad(write_json(tmp_path / "train.json", squad_document(GOOD_QAS)), on_bad_example="ignore")
