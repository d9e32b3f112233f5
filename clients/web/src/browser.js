// Browser: open a bundle served next to the page with onnxruntime-web (WebAssembly, everything on the device).
import { BundleError, QuestionAnswerer, parseQaConfig } from "./answerer.js";

export * from "./index.js";

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new BundleError(`${url}: HTTP ${response.status} (not an app bundle?)`);
  return response;
}

/**
 * A QuestionAnswerer on the bundle at `bundleUrl` (a folder URL ending in "/").
 * @param {object} ort the onnxruntime-web module
 * @returns {Promise<{answerer: QuestionAnswerer, qaConfig: object, modelBytes: number}>}
 */
export async function loadBundleFromUrl(ort, bundleUrl, { threads = 1 } = {}) {
  const base = new URL(bundleUrl, globalThis.location?.href);
  const qaConfigText = await (await fetchOk(new URL("qa_config.json", base))).text();
  const qaConfig = parseQaConfig(qaConfigText, new URL("qa_config.json", base).href);
  const model = new Uint8Array(await (await fetchOk(new URL(qaConfig.onnx.model, base))).arrayBuffer());
  const tokenizerJson = await (await fetchOk(new URL(qaConfig.tokenizer.file ?? "tokenizer.json", base))).text();
  ort.env.wasm.numThreads = threads; // one thread needs no cross-origin isolation headers
  const answerer = await QuestionAnswerer.fromBundleFiles(
    ort, { qaConfig: qaConfigText, model, tokenizerJson }, { executionProviders: ["wasm"], graphOptimizationLevel: "all" },
  );
  return { answerer, qaConfig, modelBytes: model.byteLength };
}
