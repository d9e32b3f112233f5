// Answers of transformers.js (npm @huggingface/transformers) on the bundle's Hugging Face layout, offline: the
// check that the folder loads as it is in pipeline("question-answering", ...), compared by tests/export/test_hf_layout.py
// with the torch-free Python answerer.
//   node scripts/transformers-js-answer.mjs --model DIR --questions FILE
// DIR: the bundle's huggingface/ folder. FILE: a JSON list of {id, question, context}. Prints {id: {answer, score}}:
// transformers.js decodes the answer from its tokens (lower-cased for an uncased model), it has no spans.
import { readFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { env, pipeline } from "@huggingface/transformers";

const { values } = parseArgs({ options: { model: { type: "string" }, questions: { type: "string" } } });
if (!values.model || !values.questions) {
  console.error("usage: node scripts/transformers-js-answer.mjs --model DIR --questions FILE");
  process.exit(2);
}
// Nothing from the hub: transformers.js resolves a model id under localModelPath, so the folder's parent is the
// root and its name the id; with remote models off, a missing file is an error, never a download.
const folder = path.resolve(values.model);
env.allowRemoteModels = false;
env.localModelPath = path.dirname(folder);
const answerer = await pipeline("question-answering", path.basename(folder), { local_files_only: true });

const answers = {};
for (const { id, question, context } of JSON.parse(readFileSync(values.questions, "utf8"))) {
  // One question per call: a batch would pad the shorter pairs, and the int8 graph's dynamic activation scales
  // see the padding, so its logits would depend on which questions share the batch.
  const { answer, score } = await answerer(question, context);
  answers[id] = { answer, score };
}
process.stdout.write(JSON.stringify(answers));
