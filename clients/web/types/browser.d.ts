// Type declarations of the browser entry point ("distilqa-client/browser"): src/browser.js.
import type { OrtModuleWithWasm, QaConfig, QuestionAnswerer } from "./index.js";

export * from "./index.js";

/** The page's globalThis, as far as the thread choice reads it. */
export interface ThreadScope {
  crossOriginIsolated?: boolean;
  navigator?: { hardwareConcurrency?: number };
}

/** One WebAssembly thread per logical core in a cross-origin-isolated page, one otherwise. */
export declare function defaultThreads(scope?: ThreadScope): number;

export interface LoadedBundle {
  answerer: QuestionAnswerer;
  qaConfig: QaConfig;
  /** the model file's size in bytes */
  modelBytes: number;
  /** the WebAssembly threads onnxruntime-web runs (1 where the page is not cross-origin isolated) */
  threads: number;
}

/**
 * A QuestionAnswerer on the bundle at `bundleUrl` (a folder URL ending in "/"), fetched, with `threads`
 * WebAssembly threads asked for (default: defaultThreads()). Pass the onnxruntime-web module.
 */
export declare function loadBundleFromUrl(
  ort: OrtModuleWithWasm,
  bundleUrl: string | URL,
  options?: { threads?: number },
): Promise<LoadedBundle>;
