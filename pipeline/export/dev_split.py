"""The dev set split into the questions the gates score and the questions the int8 search tunes on.

Every compressed variant is tuned (static scales calibrated, layer sensitivity measured, the fallback's steps
scored) on questions the gates never score, and gated on the others, so a gate never reads a question the variant
was fitted to. Both parts come from the dev set (never from training questions, which the model was fitted on and
which would understate what quantization costs). The rule, in the dev file's order (prepare_data's dev.jsonl):

  enough questions  (at least export.gates.dev_questions + export.quantize.tuning_questions):
                    the first dev_questions are gated; the next tuning_questions whose paragraph holds no gated
                    question tune;
  fewer             whole paragraphs, from the last one back, tune while they come nearer to
                    export.gates.tuning_share of the questions (at most tuning_questions); the questions of the other paragraphs are gated (the
                    first dev_questions of them); each part holds at least export.gates.min_split_questions;
  too few           fewer than twice min_split_questions, or no such split: an error naming the dev set and its
                    count.

No paragraph has questions on both sides, so a tuning question never shares its context with a gated one. The
split is written as question ids, and quantize.json records which of them each tuning step read.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import PipelineError


class DevSplitError(PipelineError, ValueError):
    """The dev set is too small to gate and tune on disjoint questions; the message names the key and the count."""


@dataclass(frozen=True)
class DevSplit:
    """Rows of dev.jsonl (in file order) the gates score and rows the int8 search tunes on, with the rule used."""

    gated_rows: list[int]
    tuning_rows: list[int]
    n_dev: int
    rule: str

    @property
    def n_gated(self) -> int:
        return len(self.gated_rows)

    @property
    def n_tuning(self) -> int:
        return len(self.tuning_rows)

    def record(self) -> dict:
        return {"dev_questions": self.n_dev, "gated": self.n_gated, "tuning": self.n_tuning, "rule": self.rule}


def split_dev(contexts: list[str], dev_questions: int | None, tuning_questions: int, tuning_share: float,
              min_questions: int, source: str) -> DevSplit:
    """The split of a dev set whose questions have these contexts, in file order (see the module docstring).
    `source` names the dev set in the error (e.g. "data.squad_dev ./my-dev.json")."""
    n = len(contexts)
    too_few = (f"{source}: {n} answerable dev question(s); the gates and the int8 tuning need at least "
               f"{2 * min_questions} ({min_questions} each, export.gates.min_split_questions), on different "
               "paragraphs: give a longer dev file")
    if n < 2 * min_questions:
        raise DevSplitError(too_few)
    wanted_gated = dev_questions or n
    if n >= wanted_gated + tuning_questions:
        gated = list(range(wanted_gated))
        gated_contexts = {contexts[row] for row in gated}
        tuning = [row for row in range(wanted_gated, n) if contexts[row] not in gated_contexts][:tuning_questions]
        if len(tuning) >= min(tuning_questions, max(min_questions, round(n * tuning_share))):
            return DevSplit(gated, tuning, n, f"the first {wanted_gated} dev questions gated "
                            f"(export.gates.dev_questions); the next {len(tuning)} on other paragraphs tune "
                            "(export.quantize.tuning_questions)")
    wanted_tuning = min(tuning_questions, max(min_questions, round(n * tuning_share)))
    rows_by_context: dict[str, list[int]] = {}
    for row, context in enumerate(contexts):
        rows_by_context.setdefault(context, []).append(row)
    tuning, tuning_contexts = [], set()
    for context in reversed(list(rows_by_context)):  # whole paragraphs, the last ones first
        rows = rows_by_context[context]
        # nearest to the share: a paragraph goes in while it brings the count closer (or below the floor)
        if len(tuning) >= min_questions and abs(len(tuning) + len(rows) - wanted_tuning) >= abs(len(tuning) - wanted_tuning):
            break
        tuning += rows
        tuning_contexts.add(context)
    gated = [row for row in range(n) if contexts[row] not in tuning_contexts][:wanted_gated]
    if len(gated) < min(min_questions, wanted_gated) or len(tuning) < min_questions:
        raise DevSplitError(too_few)
    return DevSplit(gated, sorted(tuning), n,
                    f"{n} dev questions are fewer than export.gates.dev_questions ({dev_questions or 'all'}) + "
                    f"export.quantize.tuning_questions ({tuning_questions}): the last paragraphs' {len(tuning)} "
                    f"questions tune (export.gates.tuning_share {tuning_share}), {len(gated)} of the others are "
                    f"gated (at least {min_questions} each)")


def split_for(contexts: list[str], cfg, source: str) -> DevSplit:
    """split_dev with a config's export.gates and export.quantize settings."""
    gates = cfg.export.gates
    return split_dev(contexts, gates.dev_questions, cfg.export.quantize.tuning_questions, gates.tuning_share,
                     gates.min_split_questions, source)


def dev_source(cfg) -> str:
    """How the error names the dev set: the key and its value."""
    if cfg.data.squad_dev:
        return f"data.squad_dev {cfg.data.squad_dev}"
    return f"data.squad {cfg.data.squad} (its dev split)"
