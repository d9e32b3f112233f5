// Type declarations of the core entry point ("distilqa-client"): src/index.js, written by hand beside the
// JavaScript and checked by `npm test` (tsc on test/types/consumer.ts; test/package.test.mjs compares the
// exported names with the modules').

// ------------------------------------------------------------------------------------------- onnxruntime

/** The tensors the client feeds: int64 [windows, length]; every onnxruntime package's Tensor takes these. */
export interface OrtTensorConstructor {
  new (type: "int64", data: BigInt64Array, dims: readonly number[]): unknown;
}

/** What the client calls on an ort.InferenceSession. */
export interface OrtSession {
  readonly inputNames: readonly string[];
  run(feeds: Record<string, unknown>): Promise<Record<string, { readonly data: unknown }>>;
}

/**
 * The part of an onnxruntime module the core uses: onnxruntime-node, onnxruntime-web and
 * onnxruntime-react-native all fit. Pass the module itself: `import * as ort from "onnxruntime-node"`.
 */
export interface OrtModule {
  Tensor: OrtTensorConstructor;
  InferenceSession: {
    create(model: Uint8Array, options?: object): Promise<OrtSession>;
    create(path: string, options?: object): Promise<OrtSession>;
  };
}

/** An onnxruntime module with WebAssembly settings (onnxruntime-web; onnxruntime-node has them too). */
export interface OrtModuleWithWasm extends OrtModule {
  env: { wasm: { numThreads?: number } };
}

// ------------------------------------------------------------------------------------------------ errors

/** A bundle that cannot be read (missing file or key, bad setting) or a question that cannot be answered. */
export declare class BundleError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
  name: "BundleError";
}

/** A tokenizer file that is not a BERT WordPiece tokenizer this client reads. */
export declare class TokenizerError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
  name: "TokenizerError";
}

// --------------------------------------------------------------------------------------------- tokenizer

/** Token ids of a text, without special tokens, and each token's [start, end) in code points of the text. */
export interface Encoding {
  ids: number[];
  offsets: Array<[number, number]>;
}

export interface SpecialTokens {
  cls: string;
  sep: string;
  pad: string;
}

export interface BertTokenizerOptions {
  /** token -> id */
  vocab: Map<string, number>;
  lowercase: boolean;
  stripAccents: boolean;
  cleanText?: boolean;
  handleChineseChars?: boolean;
  unkToken?: string;
  continuingSubwordPrefix?: string;
  maxInputCharsPerWord?: number;
  /** matched on the raw text before normalization */
  addedTokens?: ReadonlyArray<{ content: string; id: number }>;
  specialTokens?: SpecialTokens;
}

/** BERT normalization, pre-tokenization and WordPiece, with the ids and offsets of Python's `tokenizers`. */
export declare class BertTokenizer {
  constructor(options: BertTokenizerOptions);
  readonly vocab: Map<string, number>;
  readonly lowercase: boolean;
  readonly stripAccents: boolean;
  readonly clsId: number;
  readonly sepId: number;
  readonly padId: number;
  readonly unkId: number;
  /** From the parsed tokenizer.json of a BERT WordPiece tokenizer; `source` names it in errors. */
  static fromTokenizerJson(json: object, source?: string): BertTokenizer;
  /** From vocab.txt (one token a line, id = line number) and the normalizer flags. */
  static fromVocabText(
    text: string,
    options: { lowercase: boolean; stripAccents: boolean; specialTokens?: SpecialTokens & { unk?: string } },
    source?: string,
  ): BertTokenizer;
  /** Ids and code-point offsets of one text, without special tokens. */
  encode(text: string): Encoding;
}

/** The code points of a string, one string each (an emoji is one entry, not two UTF-16 halves). */
export declare function codePoints(text: string): string[];

/** text[start:end] where start and end count code points, as Python slices a str. */
export declare function codePointSlice(text: string, start: number, end: number): string;

/**
 * The UTF-16 index of every code point boundary of `text` (entry i: where code point i starts; the last entry is
 * text.length): turns code-point offsets (Encoding.offsets, Window.offsets) into string indices.
 */
export declare function utf16IndexOfCodePoints(text: string): number[];

// ---------------------------------------------------------------------------------------------- answerer

/** The windowing and n-best settings of qa_config.json. */
export interface QaSettings {
  max_seq_length: number;
  doc_stride: number;
  n_best_size: number;
  max_answer_length: number;
}

/** qa_config.json of an app bundle (the keys the client reads; the file holds more). */
export interface QaConfig extends QaSettings {
  tokenizer: {
    file?: string;
    vocab?: string;
    lowercase?: boolean;
    strip_accents?: boolean;
    special_tokens?: Partial<Record<"cls" | "sep" | "pad" | "unk", { token?: string }>>;
    [key: string]: unknown;
  };
  onnx: { model: string; [key: string]: unknown };
  [key: string]: unknown;
}

/** The contents of a bundle's files: qa_config.json text, the model and tokenizer.json or vocab.txt text. */
export interface BundleFiles {
  qaConfig: string;
  /** The ONNX file's bytes, or a path or URI that ort.InferenceSession.create opens itself. */
  model: Uint8Array | string;
  tokenizerJson?: string;
  vocabText?: string;
}

export interface Example {
  id: string;
  question: string;
  context: string;
}

/** One window: [CLS] question [SEP] context part [SEP]; offsets in code points for context tokens, else null. */
export interface Window {
  exampleId: string;
  ids: number[];
  typeIds: number[];
  offsets: Array<[number, number] | null>;
}

/**
 * A candidate answer. start/end: UTF-16 indices of the context, what JavaScript strings index
 * (context.slice(start, end) === text). startCodePoint/endCodePoint: code points, what Python str indices and
 * the Python answerer's start/end count (codePointSlice(context, startCodePoint, endCodePoint) === text). The
 * two differ once a character outside the Basic Multilingual Plane (an emoji) comes before the answer.
 */
export interface AnswerCandidate {
  text: string;
  start: number;
  end: number;
  startCodePoint: number;
  endCodePoint: number;
  /** start logit + end logit (float32) */
  score: number;
  startLogit: number;
  endLogit: number;
}

/** The answer to one question; offsets as in AnswerCandidate. No valid span: "", offsets 0, score null. */
export interface Answer {
  answer: string;
  start: number;
  end: number;
  startCodePoint: number;
  endCodePoint: number;
  score: number | null;
  /** the best candidates, best first (the first is the answer) */
  nBest: AnswerCandidate[];
  /** how many windows the context took */
  windows: number;
}

/** Logits of one window, max_seq_length long. */
export interface WindowLogits {
  startLogits: Float32Array;
  endLogits: Float32Array;
}

/** Extractive question answering on an ONNX session: windows, batched model calls, n-best spans. */
export declare class QuestionAnswerer {
  /**
   * @param ort the onnxruntime module (its Tensor)
   * @param session an InferenceSession of the bundle's model
   * @param settings qa_config.json's max_seq_length, doc_stride, n_best_size, max_answer_length
   * @param batchSize windows per model call (default 16)
   */
  constructor(
    ort: Pick<OrtModule, "Tensor">,
    session: OrtSession,
    tokenizer: BertTokenizer,
    settings: QaSettings,
    batchSize?: number,
  );
  readonly session: OrtSession;
  readonly tokenizer: BertTokenizer;
  readonly maxSeqLength: number;
  readonly docStride: number;
  readonly nBestSize: number;
  readonly maxAnswerLength: number;
  batchSize: number;
  /** An answerer from a bundle's file contents; sessionOptions go to ort.InferenceSession.create. */
  static fromBundleFiles(ort: OrtModule, files: BundleFiles, sessionOptions?: object): Promise<QuestionAnswerer>;
  /** Every window of every example, in example order. */
  windows(examples: readonly Example[]): Window[];
  /** Token ranges [start, stop) of the context in each window. */
  contextParts(questionLength: number, contextLength: number, exampleId: string): Array<{ start: number; stop: number }>;
  /** Start and end logits per window (past a batch's longest window: -1e4). */
  windowLogits(windows: readonly Window[]): Promise<WindowLogits[]>;
  /** Question id -> candidate answers, best first. */
  nBest(examples: readonly Example[]): Promise<Record<string, AnswerCandidate[]>>;
  /** nBest() and the windows it ran. */
  nBestWithWindows(examples: readonly Example[]): Promise<{ answers: Record<string, AnswerCandidate[]>; windows: Window[] }>;
  /** Question id -> answer text ("" when no window holds a valid span). */
  predict(examples: readonly Example[]): Promise<Record<string, string>>;
  /** One question, with up to `nBest` candidates (default 5). */
  answer(question: string, context: string, nBest?: number): Promise<Answer>;
}

/** [begin, end) window rows of each model call: one question's consecutive windows, up to batchSize a call. */
export declare function questionBatches(windows: readonly { exampleId: string }[], batchSize: number): [number, number][];

/** Parse and check qa_config.json text; `source` names the file in errors. */
export declare function parseQaConfig(text: string, source?: string): QaConfig;

/** The bundle's tokenizer from tokenizer.json text (preferred) or vocab.txt text with qa_config's flags. */
export declare function tokenizerFromBundleFiles(
  qaConfig: QaConfig,
  files: { tokenizerJson?: string; vocabText?: string },
): BertTokenizer;

/** Best candidates of one question over its windows' logits (offsets in code points of `context`). */
export declare function nBestAnswers(
  context: string,
  windows: ReadonlyArray<{
    offsets: ReadonlyArray<readonly [number, number] | null>;
    startLogits: ArrayLike<number>;
    endLogits: ArrayLike<number>;
  }>,
  nBestSize: number,
  maxAnswerLength: number,
): AnswerCandidate[];
