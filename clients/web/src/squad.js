// n-best answer spans over a question's windows: pipeline/runtime/squad.py's n_best_predictions, step for step.
import { utf16IndexOfCodePoints } from "./tokenizer.js";

/**
 * The n positions with the largest values, largest first (ties: the later position first, as numpy's stable
 * argsort reversed); among `positions` when given.
 */
export function topPositions(values, n, positions = Array.from(values.keys())) {
  const order = [...positions];
  order.sort((a, b) => values[a] - values[b] || a - b);
  return order.reverse().slice(0, n);
}

/** Positions of the window's context tokens (the logits may run past the offsets: padding). */
function contextPositions(offsets, length) {
  const positions = [];
  for (let position = 0; position < Math.min(length, offsets.length); position++) {
    if (offsets[position] !== null) positions.push(position);
  }
  return positions;
}

/**
 * Valid spans among the top-n start x top-n end context positions of one window: the top n are taken among
 * context tokens only, so the logits of padding, [CLS] and the question never crowd them out.
 */
export function windowCandidates(offsets, startLogits, endLogits, nBestSize, maxAnswerLength) {
  const candidates = [];
  const context = contextPositions(offsets, startLogits.length);
  for (const start of topPositions(startLogits, nBestSize, context)) {
    for (const end of topPositions(endLogits, nBestSize, context)) {
      if (end < start || end - start + 1 > maxAnswerLength) continue;
      candidates.push({
        charStart: offsets[start][0],
        charEnd: offsets[end][1],
        // The model's logits are float32 and so is their sum in the Python answerer (pipeline/runtime/answering.py).
        score: Math.fround(startLogits[start] + endLogits[end]),
        startLogit: startLogits[start],
        endLogit: endLogits[end],
      });
    }
  }
  return candidates;
}

/**
 * Best candidates of one question over all its windows, best first:
 * {text, start, end, startCodePoint, endCodePoint, score, startLogit, endLogit}.
 * `windows` holds {offsets, startLogits, endLogits} per window, offsets in code points of `context`.
 * start/end are UTF-16 indices of `context` (context.slice(start, end) === text); startCodePoint/endCodePoint
 * count code points, as Python's str indices and pipeline/runtime/answering.py's start/end do.
 */
export function nBestAnswers(context, windows, nBestSize, maxAnswerLength) {
  let candidates = [];
  for (const window of windows) {
    candidates = candidates.concat(
      windowCandidates(window.offsets, window.startLogits, window.endLogits, nBestSize, maxAnswerLength),
    );
  }
  // Array.prototype.sort is stable: equal scores keep window order, as Python's sorted() does.
  candidates.sort((a, b) => b.score - a.score);
  const utf16 = utf16IndexOfCodePoints(context);
  return candidates.slice(0, nBestSize).map((candidate) => ({
    text: context.slice(utf16[candidate.charStart], utf16[candidate.charEnd]),
    start: utf16[candidate.charStart],
    end: utf16[candidate.charEnd],
    startCodePoint: candidate.charStart,
    endCodePoint: candidate.charEnd,
    score: candidate.score,
    startLogit: candidate.startLogit,
    endLogit: candidate.endLogit,
  }));
}
