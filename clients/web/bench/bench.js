// The latency page: scripts/bench.mjs --backend chromium opens it (served cross-origin isolated by
// scripts/serve-demo.mjs) and calls runBenchmark. One page times one model at one thread count, because
// onnxruntime-web fixes its threads when the page creates its first session.
import * as ort from "../node_modules/onnxruntime-web/dist/ort.wasm.min.mjs";
import { timeLengths } from "./latency.js";

ort.env.wasm.wasmPaths = new URL("../node_modules/onnxruntime-web/dist/", import.meta.url).href;

/**
 * Time the model at `modelUrl` at `threads` WebAssembly threads: {latency_ms: {seqL: {threadsT: {p50, p90}} |
 * null}, threads, version, cross_origin_isolated}. A page that cannot run the threads asked for throws.
 */
async function runBenchmark({ modelUrl, lengths, vocabSize, maxPositions, runs, warmup, threads }) {
  ort.env.wasm.numThreads = threads;
  const response = await fetch(modelUrl);
  if (!response.ok) throw new Error(`${modelUrl}: HTTP ${response.status}`);
  const model = new Uint8Array(await response.arrayBuffer());
  // The session options of the Node WebAssembly timing (src/node.js sessionOptions).
  const session = await ort.InferenceSession.create(model, { executionProviders: ["wasm"], graphOptimizationLevel: "all" });
  const used = ort.env.wasm.numThreads; // onnxruntime-web sets it back to 1 where the page cannot run threads
  if (used !== threads) {
    throw new Error(`the page ran ${used} thread${used === 1 ? "" : "s"} where ${threads} were asked for (cross-origin ` +
      `isolated: ${crossOriginIsolated}); WebAssembly threads need the isolation headers of scripts/serve-demo.mjs`);
  }
  const latency = await timeLengths(ort, session, {
    lengths, vocabSize, maxPositions: maxPositions ?? Infinity, runs, warmup, threads,
  });
  await session.release();
  return { latency_ms: latency, threads, version: ort.env.versions.web, cross_origin_isolated: crossOriginIsolated };
}

window.runBenchmark = runBenchmark;
document.body.dataset.ready = "true";
