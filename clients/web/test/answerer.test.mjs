// Windows, batching and n-best search of the client on a stand-in session that returns chosen logits.
import assert from "node:assert/strict";
import { test } from "node:test";
import { BundleError, QuestionAnswerer, parseQaConfig, questionBatches } from "../src/answerer.js";
import { nBestAnswers, topPositions } from "../src/squad.js";
import { BertTokenizer, TokenizerError, codePointSlice, utf16IndexOfCodePoints } from "../src/tokenizer.js";

const WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "?", "w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9"];
const tokenizer = new BertTokenizer({ vocab: new Map(WORDS.map((w, i) => [w, i])), lowercase: true, stripAccents: true });

class Tensor {
  constructor(type, data, dims) {
    Object.assign(this, { type, data, dims });
  }
}

/** A session whose start logit peaks on token `startWord` and end logit on `endWord`; it records its calls. */
function fakeSession(startWord, endWord) {
  const calls = [];
  return {
    calls,
    inputNames: ["input_ids", "attention_mask"],
    async run(feeds) {
      const [batch, length] = feeds.input_ids.dims;
      calls.push([batch, length]);
      const ids = feeds.input_ids.data;
      const start = new Float32Array(batch * length);
      const end = new Float32Array(batch * length);
      for (let i = 0; i < ids.length; i += 1) {
        start[i] = Number(ids[i]) === WORDS.indexOf(startWord) ? 5 : -Number(ids[i]) / 100;
        end[i] = Number(ids[i]) === WORDS.indexOf(endWord) ? 5 : -Number(ids[i]) / 100;
      }
      return { start_logits: new Tensor("float32", start, [batch, length]), end_logits: new Tensor("float32", end, [batch, length]) };
    },
  };
}

const SETTINGS = { max_seq_length: 8, doc_stride: 2, n_best_size: 5, max_answer_length: 3 };
const CONTEXT = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9";

test("a long context is cut into windows that share doc_stride tokens, as tokenizers' only_second truncation", () => {
  const answerer = new QuestionAnswerer({ Tensor }, fakeSession("w1", "w1"), tokenizer, SETTINGS);
  const windows = answerer.windows([{ id: "q", question: "who?", context: CONTEXT }]);
  // room = 8 - 2 question tokens - 3 specials = 3 context tokens a window, stepping 3 - 2 = 1 token.
  assert.deepEqual(windows.map((w) => w.ids.slice(4, -1).map((id) => WORDS[id]).join(" ")),
    ["w0 w1 w2", "w1 w2 w3", "w2 w3 w4", "w3 w4 w5", "w4 w5 w6", "w5 w6 w7", "w6 w7 w8", "w7 w8 w9"]);
  assert.deepEqual(windows[1].typeIds, [0, 0, 0, 0, 1, 1, 1, 1]);
  assert.deepEqual(windows[1].offsets.slice(0, 5), [null, null, null, null, [3, 5]]);
});

test("windows run in batches cut to their longest window; the answer is cut from the context", async () => {
  const session = fakeSession("w7", "w8");
  const answerer = new QuestionAnswerer({ Tensor }, session, tokenizer, SETTINGS, 3);
  const result = await answerer.answer("who?", CONTEXT);
  assert.equal(result.answer, "w7 w8");
  assert.equal(CONTEXT.slice(result.start, result.end), "w7 w8");
  assert.equal(result.windows, 8);
  assert.deepEqual(session.calls, [[3, 8], [3, 8], [2, 8]]);
  const short = await answerer.answer("who?", "w7 w8");
  assert.equal(short.answer, "w7 w8");
  assert.deepEqual(session.calls.at(-1), [1, 7]);
});

test("each model call holds one question's windows only, never another question's", async () => {
  const session = fakeSession("w1", "w2");
  const answerer = new QuestionAnswerer({ Tensor }, session, tokenizer, SETTINGS, 16);
  const examples = [
    { id: "a", question: "who?", context: "w0 w1 w2 w3 w4" },
    { id: "b", question: "who?", context: "w1 w2" },
    { id: "c", question: "who?", context: "w0 w1 w2 w3" },
  ];
  await answerer.predict(examples);
  // a: 3 windows of 8; b: 1 window of 7; c: 2 windows of 8: three calls, each padded to its own longest window.
  assert.deepEqual(session.calls, [[3, 8], [1, 7], [2, 8]]);
  const windows = [0, 0, 0, 1, 2, 2].map((id) => ({ exampleId: String(id) }));
  assert.deepEqual(questionBatches(windows, 2), [[0, 2], [2, 3], [3, 4], [4, 6]]);
});

test("a graph that takes token_type_ids (BERT, ELECTRA, MobileBERT) is fed the windows' token types; one that does not (DistilBERT) is not", async () => {
  for (const inputNames of [["input_ids", "attention_mask", "token_type_ids"], ["input_ids", "attention_mask"]]) {
    const session = { ...fakeSession("w1", "w1"), inputNames, feeds: [] };
    const run = session.run;
    session.run = async (feeds) => {
      session.feeds.push(feeds);
      return run(feeds);
    };
    const answerer = new QuestionAnswerer({ Tensor }, session, tokenizer, SETTINGS, 2);
    await answerer.answer("who?", "w0 w1 w2 w3 w4");
    assert.deepEqual(session.feeds.map((feeds) => Object.keys(feeds).sort()), [[...inputNames].sort(), [...inputNames].sort()]);
    if (!inputNames.includes("token_type_ids")) continue;
    // Three windows of 8 ([CLS] who ? [SEP] w w w [SEP]) in batches of 2 and 1: question 0, context and its [SEP] 1.
    const types = session.feeds.map((feeds) => Array.from(feeds.token_type_ids.data, Number));
    assert.deepEqual(types[0], [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
    assert.deepEqual(session.feeds.map((feeds) => feeds.token_type_ids.dims), [[2, 8], [1, 8]]);
    assert.equal(session.feeds[0].token_type_ids.type, "int64");
  }
});

test("spans longer than max_answer_length or ending before they start are never answers", () => {
  const offsets = [null, [0, 2], [3, 5], [6, 8], [9, 11], [12, 14]];
  const start = Float32Array.from([9, 1, 0, 0, 0, 8]);
  const end = Float32Array.from([9, 7, 0, 0, 0, -9]);
  const [best] = nBestAnswers("w0 w1 w2 w3 w4", [{ offsets, startLogits: start, endLogits: end }], 5, 3);
  // start 5 / end 1 ends before it starts; position 0 is the question: the best valid span is 1..1.
  assert.equal(best.text, "w0");
  assert.deepEqual(topPositions(Float32Array.from([1, 3, 3, 2]), 3), [2, 1, 3]);
  assert.deepEqual(topPositions(Float32Array.from([1, 3, 3, 2]), 3, [0, 1, 3]), [1, 3, 0]);
});

test("the question, [CLS] and padding never crowd the context out of the top n", () => {
  const offsets = [null, null, [0, 2], [3, 5], [6, 8], null];
  // Non-context positions, and padding past the offsets, outscore every context token.
  const start = Float32Array.from([50, 50, 0, 1, 0, 50, 80, 80, 80]);
  const end = Float32Array.from([50, 50, 0, 1, 0, 50, 80, 80, 80]);
  const [best] = nBestAnswers("w0 w1 w2", [{ offsets, startLogits: start, endLogits: end }], 2, 3);
  assert.equal(best.text, "w1");
});

test("a question that leaves no more room than doc_stride is refused by id; bad settings and inputs too", async () => {
  const answerer = new QuestionAnswerer({ Tensor }, fakeSession("w1", "w1"), tokenizer, SETTINGS);
  assert.throws(() => answerer.windows([{ id: "q7", question: "who who who", context: CONTEXT }]),
    /question "q7": 3 tokens leave 2 for the context .* the question is too long/);
  assert.throws(() => new QuestionAnswerer({ Tensor }, fakeSession("w1", "w1"), tokenizer, { ...SETTINGS, doc_stride: 8 }),
    BundleError);
  await assert.rejects(
    answerer.predict([{ id: "a", question: "who?", context: "w1" }, { id: "a", question: "who?", context: "w2" }]),
    { name: "BundleError", message: /question id "a" appears twice/ },
  );
  await assert.rejects(answerer.answer("who?", 42), { name: "BundleError", message: /field "context" must be a string/ });
});

test("answers give UTF-16 offsets (JavaScript string indices) beside code point offsets (Python str indices)", async () => {
  const answerer = new QuestionAnswerer({ Tensor }, fakeSession("w7", "w8"), tokenizer, SETTINGS);
  // 😀 and 👋🏽 are outside the Basic Multilingual Plane: one code point but two UTF-16 units each (👋🏽 is two
  // code points, hand and skin tone); é is one of each.
  const context = "😀 é 👋🏽 w7 w8 w9";
  const result = await answerer.answer("who?", context);
  assert.equal(result.answer, "w7 w8");
  assert.deepEqual([result.start, result.end], [10, 15]);
  assert.deepEqual([result.startCodePoint, result.endCodePoint], [7, 12]);
  assert.equal(context.slice(result.start, result.end), result.answer);
  assert.equal(codePointSlice(context, result.startCodePoint, result.endCodePoint), result.answer);
  for (const candidate of result.nBest) {
    assert.equal(context.slice(candidate.start, candidate.end), candidate.text);
    assert.equal(codePointSlice(context, candidate.startCodePoint, candidate.endCodePoint), candidate.text);
  }
  assert.deepEqual(utf16IndexOfCodePoints("a😀b"), [0, 1, 3, 4]);
  // No valid span (an empty context): no answer, zero offsets, no score.
  const none = await answerer.answer("who?", "");
  assert.deepEqual([none.answer, none.start, none.end, none.startCodePoint, none.endCodePoint, none.score],
    ["", 0, 0, 0, 0, null]);
});

test("errors say their class in name and keep the error they wrap as cause", () => {
  assert.throws(() => parseQaConfig("{", "bundle/qa_config.json"), (error) => {
    assert.ok(error instanceof BundleError && error instanceof Error);
    assert.equal(error.name, "BundleError");
    assert.match(String(error), /^BundleError: bundle\/qa_config.json: invalid JSON/);
    assert.ok(error.cause instanceof SyntaxError);
    return true;
  });
  assert.throws(() => new BertTokenizer({ vocab: new Map(), lowercase: true, stripAccents: true }),
    { name: "TokenizerError", message: "the vocabulary has no [CLS] token" });
  assert.ok(new TokenizerError("x") instanceof Error);
});
