// An app's TypeScript on the package's three entry points, checked by `tsc -p tsconfig.json` (npm test) and
// never run: the imports go through package.json "exports" (the package refers to itself by name), and the
// real onnxruntime modules must fit the client's OrtModule.
import * as ortNode from "onnxruntime-node";
import * as ortWeb from "onnxruntime-web";
import {
  type Answer,
  type AnswerCandidate,
  BertTokenizer,
  BundleError,
  codePointSlice,
  nBestAnswers,
  parseQaConfig,
  QuestionAnswerer,
  TokenizerError,
  tokenizerFromBundleFiles,
  utf16IndexOfCodePoints,
} from "distilqa-client";
import { loadBundle, onnxRuntime, sessionOptions } from "distilqa-client/node";
import { defaultThreads, loadBundleFromUrl, type LoadedBundle } from "distilqa-client/browser";

export async function inNode(context: string): Promise<string> {
  const answerer = await loadBundle("artifacts/bundle", { backend: "node", threads: 1, tokenizer: "json" });
  const result: Answer = await answerer.answer("Who?", context, 3);
  const best: AnswerCandidate | undefined = result.nBest[0];
  const score: number | null = result.score;
  const sameText: boolean = context.slice(result.start, result.end) === result.answer
    && codePointSlice(context, result.startCodePoint, result.endCodePoint) === result.answer;
  // @ts-expect-error: the backends are "node" and "web"
  await loadBundle("artifacts/bundle", { backend: "gpu" });
  const predictions: Record<string, string> = await answerer.predict([{ id: "a", question: "Who?", context }]);
  return `${best?.text} ${score} ${sameText} ${predictions.a}`;
}

export async function withTheRuntimeModules(files: { qaConfig: string; model: Uint8Array; tokenizerJson: string }) {
  // The real onnxruntime-node and onnxruntime-web modules are what the core takes.
  const onNode = await QuestionAnswerer.fromBundleFiles(ortNode, files, { intraOpNumThreads: 1 });
  const onWeb = await QuestionAnswerer.fromBundleFiles(ortWeb, files);
  const config = parseQaConfig(files.qaConfig);
  const tokenizer: BertTokenizer = tokenizerFromBundleFiles(config, files);
  const session = await ortNode.InferenceSession.create(files.model);
  const byHand = new QuestionAnswerer(ortNode, session, tokenizer, config, 8);
  const fromPath = await QuestionAnswerer.fromBundleFiles(ortNode, { ...files, model: "bundle/model.int8.onnx" });
  const ort = await onnxRuntime("web");
  const options: object = sessionOptions(ort, "web", 2);
  // @ts-expect-error: a model is bytes or a path
  await QuestionAnswerer.fromBundleFiles(ortNode, { ...files, model: 42 });
  // @ts-expect-error: the onnxruntime module itself, not one of its parts
  await QuestionAnswerer.fromBundleFiles(ortNode.InferenceSession, files);
  return [onNode, onWeb, byHand, fromPath, options];
}

export async function inThePage(): Promise<number> {
  const loaded: LoadedBundle = await loadBundleFromUrl(ortWeb, "bundle/", { threads: defaultThreads() });
  const windows = loaded.answerer.windows([{ id: "q", question: "Who?", context: "Ana waved." }]);
  const offsets: Array<[number, number] | null> = windows[0].offsets;
  const utf16 = utf16IndexOfCodePoints("Ana waved.");
  const spans = nBestAnswers("Ana waved.", [{ offsets, startLogits: new Float32Array(8), endLogits: [0, 1] }], 5, 3);
  return loaded.threads + loaded.modelBytes + utf16.length + spans.length + loaded.qaConfig.max_seq_length;
}

export function errors(error: unknown): string {
  if (error instanceof BundleError) {
    const name: "BundleError" = error.name;
    return `${name}: ${error.message}`;
  }
  if (error instanceof TokenizerError) return error.name;
  return String(new BundleError("x", { cause: error }).cause);
}
