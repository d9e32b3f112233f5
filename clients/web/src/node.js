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

/** The onnxruntime module of a backend: "node" (onnxruntime-node) or "web" (onnxruntime-web, WebAssembly). */
export async function onnxRuntime(backend) {
  if (backend === "node") return import("onnxruntime-node");
  if (backend === "web") return import("onnxruntime-web");
  throw new BundleError(`backend ${JSON.stringify(backend)}: expected "node" or "web"`);
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
