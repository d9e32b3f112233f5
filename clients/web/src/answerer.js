// Extractive question answering on an app bundle, the same code on onnxruntime-node, onnxruntime-web and
// onnxruntime-react-native (they share the InferenceSession / Tensor API; the caller passes the module in).
//
// The steps follow pipeline/runtime/answering.py, the torch-free Python answerer:
//   1. Tokenize question and context; cut the context into windows of max_seq_length tokens
//      ([CLS] question [SEP] context part [SEP]) that overlap by doc_stride tokens.
//   2. Keep, per window, the character offsets of its context tokens (other positions: null).
//   3. Run the ONNX model on one question's windows at a time (never with another question's), padded to the
//      longest of them: a dynamic int8 graph's activation scales span the whole input (questionBatches).
//   4-5. n-best spans per window (squad.js), the best over all windows; the text is cut from the context.
// Answers carry two pairs of offsets into the context: start/end in UTF-16 units (JavaScript string indices)
// and startCodePoint/endCodePoint in code points (Python str indices, as pipeline/runtime/answering.py's start/end).
import { BertTokenizer, TokenizerError } from "./tokenizer.js";
import { nBestAnswers } from "./squad.js";

/** A bundle that cannot be read (missing file or key, bad setting) or a question that cannot be answered. */
export class BundleError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "BundleError";
  }
}

const QA_CONFIG_KEYS = ["max_seq_length", "doc_stride", "n_best_size", "max_answer_length", "tokenizer", "onnx"];
const MODEL_INPUTS = new Set(["input_ids", "attention_mask", "token_type_ids"]);
const SPECIAL_TOKENS_IN_PAIR = 3; // [CLS] question [SEP] context [SEP]
const PADDED_LOGIT = -1e4; // logits past a call's longest window, as in the Python answerer

/**
 * [begin, end) row ranges of the model calls: each question's own consecutive windows, up to batchSize a call.
 * A dynamic int8 graph computes its activation scales over the whole input, so batching a question with another
 * question's windows would change its answer; pipeline/runtime/answering.py question_batches is the same rule.
 */
export function questionBatches(windows, batchSize) {
  const batches = [];
  let begin = 0;
  for (let row = 1; row <= windows.length; row += 1) {
    if (row === windows.length || windows[row].exampleId !== windows[begin].exampleId || row - begin === batchSize) {
      batches.push([begin, row]);
      begin = row;
    }
  }
  return batches;
}

/** Parse and check qa_config.json; `source` names the file in errors. */
export function parseQaConfig(text, source = "qa_config.json") {
  let config;
  try {
    config = JSON.parse(text);
  } catch (error) {
    throw new BundleError(`${source}: invalid JSON: ${error.message}`, { cause: error });
  }
  const missing = QA_CONFIG_KEYS.filter((key) => !(key in config));
  if (missing.length > 0) throw new BundleError(`${source}: missing keys ${JSON.stringify(missing)}`);
  if (!config.onnx.model) throw new BundleError(`${source}: missing key onnx.model`);
  return config;
}

/** The bundle's tokenizer from tokenizer.json text (preferred) or vocab.txt text with qa_config's flags. */
export function tokenizerFromBundleFiles(qaConfig, { tokenizerJson, vocabText }) {
  try {
    if (tokenizerJson !== undefined) {
      return BertTokenizer.fromTokenizerJson(JSON.parse(tokenizerJson), qaConfig.tokenizer.file ?? "tokenizer.json");
    }
    const special = qaConfig.tokenizer.special_tokens ?? {};
    return BertTokenizer.fromVocabText(
      vocabText,
      {
        lowercase: qaConfig.tokenizer.lowercase,
        stripAccents: qaConfig.tokenizer.strip_accents,
        specialTokens: {
          cls: special.cls?.token ?? "[CLS]", sep: special.sep?.token ?? "[SEP]",
          pad: special.pad?.token ?? "[PAD]", unk: special.unk?.token ?? "[UNK]",
        },
      },
      qaConfig.tokenizer.vocab ?? "vocab.txt",
    );
  } catch (error) {
    if (error instanceof TokenizerError || error instanceof SyntaxError) throw new BundleError(error.message, { cause: error });
    throw error;
  }
}

export class QuestionAnswerer {
  /**
   * @param {object} ort the onnxruntime module (onnxruntime-node, onnxruntime-web or onnxruntime-react-native)
   * @param {object} session an ort.InferenceSession of the bundle's model
   * @param {BertTokenizer} tokenizer
   * @param {object} settings {max_seq_length, doc_stride, n_best_size, max_answer_length} (qa_config.json)
   * @param {number} [batchSize] windows per model call
   */
  constructor(ort, session, tokenizer, settings, batchSize = 16) {
    const { max_seq_length: maxSeqLength, doc_stride: docStride } = settings;
    if (!(docStride >= 0 && docStride < maxSeqLength)) {
      throw new BundleError(`doc_stride ${docStride} must be in [0, max_seq_length=${maxSeqLength})`);
    }
    const unknown = session.inputNames.filter((name) => !MODEL_INPUTS.has(name));
    if (unknown.length > 0) throw new BundleError(`unexpected model inputs ${JSON.stringify(unknown.sort())}`);
    this.ort = ort;
    this.session = session;
    this.tokenizer = tokenizer;
    this.maxSeqLength = maxSeqLength;
    this.docStride = docStride;
    this.nBestSize = settings.n_best_size;
    this.maxAnswerLength = settings.max_answer_length;
    this.batchSize = batchSize;
  }

  /**
   * An answerer from a bundle's file contents.
   * @param {object} ort onnxruntime module
   * @param {{qaConfig: string, model: Uint8Array | string, tokenizerJson?: string, vocabText?: string}} files
   *   model: the ONNX file's bytes, or a path or URI that ort.InferenceSession.create opens itself
   * @param {object} [sessionOptions] passed to ort.InferenceSession.create (threads, execution providers)
   */
  static async fromBundleFiles(ort, files, sessionOptions = {}) {
    const qaConfig = parseQaConfig(files.qaConfig);
    const tokenizer = tokenizerFromBundleFiles(qaConfig, files);
    const session = await ort.InferenceSession.create(files.model, sessionOptions);
    return new QuestionAnswerer(ort, session, tokenizer, qaConfig);
  }

  // ------------------------------------------------------------------------------------ 1-2: windows

  /**
   * Every window of every example ({id, question, context}), in example order:
   * {exampleId, ids, typeIds, offsets} with offsets[position] = [start, end] for context tokens, else null.
   */
  windows(examples) {
    const windows = [];
    for (const example of examples) {
      // Leading whitespace in a question only wastes window room (as in training).
      const question = this.tokenizer.encode(example.question.trimStart());
      const context = this.tokenizer.encode(example.context);
      for (const part of this.contextParts(question.ids.length, context.ids.length, example.id)) {
        const ids = [this.tokenizer.clsId, ...question.ids, this.tokenizer.sepId];
        const typeIds = new Array(ids.length).fill(0);
        const offsets = new Array(ids.length).fill(null);
        for (let position = part.start; position < part.stop; position += 1) {
          ids.push(context.ids[position]);
          typeIds.push(1);
          offsets.push(context.offsets[position]);
        }
        ids.push(this.tokenizer.sepId);
        typeIds.push(1);
        offsets.push(null);
        windows.push({ exampleId: example.id, ids, typeIds, offsets });
      }
    }
    return windows;
  }

  /** Token ranges [start, stop) of the context in each window: `tokenizers`' only_second truncation with stride. */
  contextParts(questionLength, contextLength, exampleId) {
    const room = this.maxSeqLength - questionLength - SPECIAL_TOKENS_IN_PAIR;
    if (contextLength <= room) return [{ start: 0, stop: contextLength }];
    // A context cut into windows needs room for more context than the stride shares.
    if (room <= this.docStride) {
      throw new BundleError(
        `question ${JSON.stringify(exampleId)}: ${questionLength} tokens leave ${room} for the context in a window of ` +
          `${this.maxSeqLength}, not more than doc_stride ${this.docStride}; the question is too long`,
      );
    }
    const parts = [];
    for (let start = 0; start < contextLength; start += room - this.docStride) {
      const stop = Math.min(start + room, contextLength);
      parts.push({ start, stop });
      if (stop === contextLength) break;
    }
    return parts;
  }

  // -------------------------------------------------------------------------------------- 3: the model

  /**
   * Start and end logits per window (Float32Array of max_seq_length; past the call's longest window: -1e4), one
   * question's windows a call (questionBatches), as the Python answerer runs them.
   */
  async windowLogits(windows) {
    const results = [];
    for (const [begin, end] of questionBatches(windows, this.batchSize)) {
      const batch = windows.slice(begin, end);
      // Run only up to the longest window of the call: padding costs compute.
      const length = Math.max(...batch.map((window) => window.ids.length));
      const inputIds = new BigInt64Array(batch.length * length).fill(BigInt(this.tokenizer.padId));
      const attentionMask = new BigInt64Array(batch.length * length);
      const tokenTypeIds = new BigInt64Array(batch.length * length);
      batch.forEach((window, row) => {
        for (let position = 0; position < window.ids.length; position += 1) {
          inputIds[row * length + position] = BigInt(window.ids[position]);
          attentionMask[row * length + position] = 1n;
          tokenTypeIds[row * length + position] = BigInt(window.typeIds[position]);
        }
      });
      const arrays = { input_ids: inputIds, attention_mask: attentionMask, token_type_ids: tokenTypeIds };
      const feeds = {};
      for (const name of this.session.inputNames) {
        feeds[name] = new this.ort.Tensor("int64", arrays[name], [batch.length, length]);
      }
      const outputs = await this.session.run(feeds);
      const starts = outputs.start_logits.data;
      const ends = outputs.end_logits.data;
      for (let row = 0; row < batch.length; row += 1) {
        const startLogits = new Float32Array(this.maxSeqLength).fill(PADDED_LOGIT);
        const endLogits = new Float32Array(this.maxSeqLength).fill(PADDED_LOGIT);
        startLogits.set(starts.subarray(row * length, (row + 1) * length));
        endLogits.set(ends.subarray(row * length, (row + 1) * length));
        results.push({ startLogits, endLogits });
      }
    }
    return results;
  }

  // ------------------------------------------------------------------------------------ 4-5: answers

  /**
   * Question id -> candidate answers, best first: {text, start, end, startCodePoint, endCodePoint, score,
   * startLogit, endLogit}; start/end are UTF-16 indices of the context, the others count code points.
   */
  async nBest(examples) {
    return (await this.nBestWithWindows(examples)).answers;
  }

  /** nBest() and the windows it ran: {answers, windows}. */
  async nBestWithWindows(examples) {
    checkExamples(examples);
    const windows = this.windows(examples);
    const logits = await this.windowLogits(windows);
    const windowsOfExample = new Map(examples.map((example) => [example.id, []]));
    windows.forEach((window, index) => {
      windowsOfExample.get(window.exampleId).push({ offsets: window.offsets, ...logits[index] });
    });
    const answers = {};
    for (const example of examples) {
      answers[example.id] = nBestAnswers(
        example.context, windowsOfExample.get(example.id), this.nBestSize, this.maxAnswerLength,
      );
    }
    return { answers, windows };
  }

  /** Question id -> answer text ("" when no window holds a valid span). */
  async predict(examples) {
    const nBest = await this.nBest(examples);
    const predictions = {};
    for (const [id, candidates] of Object.entries(nBest)) predictions[id] = candidates.length ? candidates[0].text : "";
    return predictions;
  }

  /**
   * One question: {answer, start, end, startCodePoint, endCodePoint, score, nBest, windows}.
   * start/end are UTF-16 indices of the context (context.slice(start, end) === answer); startCodePoint and
   * endCodePoint count code points (codePointSlice(context, startCodePoint, endCodePoint) === answer), as the
   * Python answerer's start/end do. They differ once a character outside the Basic Multilingual Plane (an
   * emoji, say) precedes the answer. No valid span: answer "", offsets 0 and score null.
   */
  async answer(question, context, nBest = 5) {
    const { answers, windows } = await this.nBestWithWindows([{ id: "q", question, context }]);
    const candidates = answers.q;
    const best = candidates[0] ?? { text: "", start: 0, end: 0, startCodePoint: 0, endCodePoint: 0, score: null };
    return {
      answer: best.text, start: best.start, end: best.end, startCodePoint: best.startCodePoint,
      endCodePoint: best.endCodePoint, score: best.score, nBest: candidates.slice(0, nBest), windows: windows.length,
    };
  }
}

function checkExamples(examples) {
  const seen = new Set();
  examples.forEach((example, index) => {
    for (const field of ["id", "question", "context"]) {
      if (typeof example?.[field] !== "string") {
        throw new BundleError(`question ${index}: field ${JSON.stringify(field)} must be a string`);
      }
    }
    if (seen.has(example.id)) throw new BundleError(`question id ${JSON.stringify(example.id)} appears twice`);
    seen.add(example.id);
  });
}
