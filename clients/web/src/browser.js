// Browser: open a bundle served next to the page with onnxruntime-web (WebAssembly, everything on the device).
import { BundleError, QuestionAnswerer, parseQaConfig } from "./answerer.js";

export * from "./index.js";

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new BundleError(`${url}: HTTP ${response.status} (not an app bundle?)`);
  return response;
}

/**
 * As many WebAssembly threads as the browser allows: one per logical core in a cross-origin-isolated page, one
 * thread otherwise (without isolation there is no SharedArrayBuffer, so no threads).
 * @param {{crossOriginIsolated?: boolean, navigator?: {hardwareConcurrency?: number}}} scope the page's globalThis
 */
export function defaultThreads(scope = globalThis) {
  if (!scope.crossOriginIsolated) return 1;
  return Math.max(1, scope.navigator?.hardwareConcurrency ?? 1);
}

/**
 * A QuestionAnswerer on the bundle at `bundleUrl` (a folder URL ending in "/"), with `threads` WebAssembly
 * threads asked for; `threads` in the result is the count onnxruntime-web runs (1 where the page is not
 * cross-origin isolated). The thread count is fixed by the first session a page creates.
 * @param {object} ort the onnxruntime-web module
 * @returns {Promise<{answerer: QuestionAnswerer, qaConfig: object, modelBytes: number, threads: number}>}
 */
export async function loadBundleFromUrl(ort, bundleUrl, { threads = defaultThreads() } = {}) {
  const base = new URL(bundleUrl, globalThis.location?.href);
  const qaConfigText = await (await fetchOk(new URL("qa_config.json", base))).text();
  const qaConfig = parseQaConfig(qaConfigText, new URL("qa_config.json", base).href);
  const model = new Uint8Array(await (await fetchOk(new URL(qaConfig.onnx.model, base))).arrayBuffer());
  const tokenizerJson = await (await fetchOk(new URL(qaConfig.tokenizer.file ?? "tokenizer.json", base))).text();
  ort.env.wasm.numThreads = threads;
  const answerer = await QuestionAnswerer.fromBundleFiles(
    ort, { qaConfig: qaConfigText, model, tokenizerJson }, { executionProviders: ["wasm"], graphOptimizationLevel: "all" },
  );
  // onnxruntime-web sets numThreads back to 1 when the page cannot run threads.
  return { answerer, qaConfig, modelBytes: model.byteLength, threads: ort.env.wasm.numThreads };
}
