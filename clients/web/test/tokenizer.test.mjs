// The tokenizer on a small hand-made vocabulary: normalization, punctuation, CJK, unknown words, offsets in
// code points. Parity with Python's tokenizers on real vocabularies: tests/test_web_client.py.
import assert from "node:assert/strict";
import { test } from "node:test";
import { BertTokenizer, codePointSlice } from "../src/tokenizer.js";

const TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zoe", "koln", "in", "lives", "!", ",", "東", "京",
  "un", "##aff", "##able", "😀", "istanbul", "a", "##b"];

function tokenizer(options = {}) {
  const vocab = new Map(TOKENS.map((token, id) => [token, id]));
  const addedTokens = TOKENS.slice(0, 5).map((content, id) => ({ content, id }));
  return new BertTokenizer({ vocab, lowercase: true, stripAccents: true, addedTokens, ...options });
}

function pieces(tok, text) {
  const { ids, offsets } = tok.encode(text);
  return ids.map((id, i) => [TOKENS[id], codePointSlice(text, offsets[i][0], offsets[i][1])]);
}

test("accents are stripped and case folded, offsets point at the original characters", () => {
  assert.deepEqual(pieces(tokenizer(), "Zoë lives in Köln!"), [
    ["zoe", "Zoë"], ["lives", "lives"], ["in", "in"], ["koln", "Köln"], ["!", "!"],
  ]);
  // A decomposed accent (o + combining diaeresis) is two code points of the original text.
  assert.deepEqual(tokenizer().encode("Ko\u0308ln").offsets, [[0, 5]]);
  // İ lowercases to i + combining dot, which accent stripping drops.
  assert.deepEqual(pieces(tokenizer(), "İstanbul"), [["istanbul", "İstanbul"]]);
});

test("word pieces, unknown words, punctuation and CJK characters", () => {
  assert.deepEqual(pieces(tokenizer(), "unaffable,東京"), [
    ["un", "un"], ["##aff", "aff"], ["##able", "able"], [",", ","], ["東", "東"], ["京", "京"],
  ]);
  assert.deepEqual(pieces(tokenizer(), "unknownword ab"), [["[UNK]", "unknownword"], ["a", "a"], ["##b", "b"]]);
  assert.deepEqual(pieces(tokenizer({ maxInputCharsPerWord: 3 }), "abab"), [["[UNK]", "abab"]]);
});

test("offsets count code points: an emoji before a word moves it by one, not two", () => {
  const { offsets } = tokenizer().encode("😀 zoe");
  assert.deepEqual(offsets, [[0, 1], [2, 5]]);
  assert.equal(codePointSlice("😀 zoe", 2, 5), "zoe");
});

test("special tokens written in the text are matched before normalization; controls are dropped", () => {
  // Added tokens match case-sensitively on the raw text: "[mask]" is ordinary text, split at its brackets.
  assert.deepEqual(pieces(tokenizer(), "zoe[SEP]koln\u0007 [mask]"), [
    ["zoe", "zoe"], ["[SEP]", "[SEP]"], ["koln", "koln"], ["[UNK]", "["], ["[UNK]", "mask"], ["[UNK]", "]"],
  ]);
});

test("a tokenizer.json that is not a BERT WordPiece tokenizer is refused by field", () => {
  assert.throws(() => BertTokenizer.fromTokenizerJson({ model: { type: "BPE" } }, "bundle/tokenizer.json"),
    /bundle\/tokenizer.json: model.type is "BPE", expected "WordPiece"/);
  const vocab = Object.fromEntries(TOKENS.map((token, id) => [token, id]));
  assert.throws(() => BertTokenizer.fromTokenizerJson({
    model: { type: "WordPiece", vocab }, normalizer: { type: "BertNormalizer" }, pre_tokenizer: { type: "Whitespace" },
  }), /pre_tokenizer.type is "Whitespace", expected "BertPreTokenizer"/);
});

test("vocab.txt gives the same tokens as the vocabulary map", () => {
  const fromText = BertTokenizer.fromVocabText(TOKENS.join("\n") + "\n", { lowercase: true, stripAccents: true });
  assert.deepEqual(fromText.encode("Zoë lives in Köln!"), tokenizer().encode("Zoë lives in Köln!"));
  assert.throws(() => BertTokenizer.fromVocabText("[PAD]\n", { lowercase: true, stripAccents: true }), /no \[CLS\] token/);
});
