// Answers and windows of the JavaScript client on a question file, for the parity check against the torch-free
// Python answerer (clients/web/scripts/check_parity.py compares them).
//   node scripts/parity.mjs --bundle DIR --questions FILE --out FILE [--backend node|web] [--tokenizer json|vocab]
// FILE: JSON lines or a JSON list of {id, question, context}, or a SQuAD file. The output holds
// {backend, predictions: {id: text}, spans: {id: {start, end, start_code_point, end_code_point}} (the best
// answer's offsets in the context: UTF-16 units and code points; absent where there is no answer),
// windows: [{example_id, input_ids, token_type_ids, context_offsets (code points)}], seconds}.
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { BundleError, loadBundle } from "../src/node.js";

export function readQuestions(path) {
  const text = readFileSync(path, "utf8");
  let records;
  if (path.endsWith(".jsonl")) {
    records = text.split("\n").filter((line) => line.trim()).map((line, index) => {
      try {
        return JSON.parse(line);
      } catch (error) {
        throw new BundleError(`${path}: line ${index + 1}: invalid JSON: ${error.message}`);
      }
    });
  } else {
    try {
      records = JSON.parse(text);
    } catch (error) {
      throw new BundleError(`${path}: invalid JSON: ${error.message}`);
    }
    if (records && Array.isArray(records.data)) {
      records = records.data.flatMap((article) => (article.paragraphs ?? []).flatMap((paragraph) =>
        (paragraph.qas ?? []).map((qa) => ({ id: qa.id, question: qa.question, context: paragraph.context }))));
    }
  }
  if (!Array.isArray(records)) throw new BundleError(`${path}: expected a list of {id, question, context}`);
  return records.map((record, index) => {
    for (const field of ["id", "question", "context"]) {
      if (typeof record?.[field] !== "string") {
        throw new BundleError(`${path}: question ${index}: field ${JSON.stringify(field)} must be a string`);
      }
    }
    return { id: record.id, question: record.question, context: record.context };
  });
}

async function main() {
  const { values } = parseArgs({
    options: {
      bundle: { type: "string" }, questions: { type: "string" }, out: { type: "string" },
      backend: { type: "string", default: "node" }, tokenizer: { type: "string", default: "json" },
    },
  });
  if (!values.bundle || !values.questions || !values.out) {
    throw new BundleError("--bundle DIR, --questions FILE and --out FILE are required");
  }
  const examples = readQuestions(values.questions);
  const answerer = await loadBundle(values.bundle, { backend: values.backend, threads: 1, tokenizer: values.tokenizer });
  const started = performance.now();
  const nBest = await answerer.nBest(examples);
  const seconds = (performance.now() - started) / 1000;
  const predictions = {};
  const spans = {};
  for (const [id, candidates] of Object.entries(nBest)) {
    predictions[id] = candidates.length ? candidates[0].text : ""; // as answerer.predict
    if (!candidates.length) continue;
    const { start, end, startCodePoint, endCodePoint } = candidates[0];
    spans[id] = { start, end, start_code_point: startCodePoint, end_code_point: endCodePoint };
  }
  const windows = answerer.windows(examples).map((window) => ({
    example_id: window.exampleId, input_ids: window.ids, token_type_ids: window.typeIds, context_offsets: window.offsets,
  }));
  const partial = `${values.out}.partial`;
  writeFileSync(partial, JSON.stringify({ backend: values.backend, predictions, spans, windows, seconds }));
  renameSync(partial, values.out); // a killed run leaves no file that looks complete
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((error) => {
    if (!(error instanceof BundleError)) throw error;
    console.error(`error: ${error.message}`);
    process.exit(2);
  });
}
