// Node.js: open a bundle folder with onnxruntime-node (native CPU) or onnxruntime-web (WebAssembly).
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { BundleError, QuestionAnswerer, parseQaConfig } from "./answerer.js";

export * from "./index.js";

async function readBundleFile(bundleDir, name, encoding) {
  try {
    return await readFile(join(bundleDir, name), encoding);
  } catch (error) {
    if (error.code === "ENOENT") throw new BundleError(`${join(bundleDir, name)}: missing (not an app bundle?)`);
    throw error;
  }
}

const RUNTIME_PACKAGES = { node: "onnxruntime-node", web: "onnxruntime-web" };

/**
 * The onnxruntime module of a backend: "node" (onnxruntime-node) or "web" (onnxruntime-web, WebAssembly). Both
 * are optional peer dependencies: the app installs the one it uses.
 */
export async function onnxRuntime(backend) {
  const name = RUNTIME_PACKAGES[backend];
  if (name === undefined) throw new BundleError(`backend ${JSON.stringify(backend)}: expected "node" or "web"`);
  try {
    return await import(name);
  } catch (error) {
    if (error?.code !== "ERR_MODULE_NOT_FOUND" || !String(error.message).includes(`'${name}'`)) throw error;
    throw new BundleError(`backend "${backend}" needs the package ${name}: npm install ${name}`, { cause: error });
  }
}

/** Session options that pin onnxruntime to `threads` intra-op threads on either backend. */
export function sessionOptions(ort, backend, threads) {
  if (backend === "web") {
    ort.env.wasm.numThreads = threads;
    return { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
  }
  return {
    executionProviders: ["cpu"], graphOptimizationLevel: "all", executionMode: "sequential",
    intraOpNumThreads: threads, interOpNumThreads: 1,
  };
}

/**
 * A QuestionAnswerer on a bundle folder (qa_config.json, tokenizer.json or vocab.txt, the ONNX model).
 * @param {string} bundleDir
 * @param {{backend?: "node"|"web", threads?: number, model?: string, tokenizer?: "json"|"vocab"}} [options]
 *   backend: onnxruntime-node (native CPU, default) or onnxruntime-web (WebAssembly); threads: intra-op threads;
 *   model: another ONNX file of the bundle than qa_config's onnx.model; tokenizer: read tokenizer.json or vocab.txt
 */
export async function loadBundle(bundleDir, { backend = "node", threads = 1, model, tokenizer = "json" } = {}) {
  const qaConfigText = await readBundleFile(bundleDir, "qa_config.json", "utf8");
  const qaConfig = parseQaConfig(qaConfigText, join(bundleDir, "qa_config.json"));
  const files = { qaConfig: qaConfigText, model: await readBundleFile(bundleDir, model ?? qaConfig.onnx.model) };
  if (tokenizer === "json") {
    files.tokenizerJson = await readBundleFile(bundleDir, qaConfig.tokenizer.file ?? "tokenizer.json", "utf8");
  } else {
    files.vocabText = await readBundleFile(bundleDir, qaConfig.tokenizer.vocab ?? "vocab.txt", "utf8");
  }
  const ort = await onnxRuntime(backend);
  return QuestionAnswerer.fromBundleFiles(ort, files, sessionOptions(ort, backend, threads));
}
