// Type declarations of the Node entry point ("distilqa-client/node"): src/node.js.
import type { OrtModuleWithWasm, QuestionAnswerer } from "./index.js";

export * from "./index.js";

/** "node": onnxruntime-node (native CPU); "web": onnxruntime-web (WebAssembly) in Node. */
export type Backend = "node" | "web";

export interface LoadBundleOptions {
  /** default "node"; the package of the backend must be installed (both are optional peer dependencies) */
  backend?: Backend;
  /** intra-op threads (default 1) */
  threads?: number;
  /** another ONNX file of the bundle than qa_config.json's onnx.model */
  model?: string;
  /** read tokenizer.json (default) or vocab.txt */
  tokenizer?: "json" | "vocab";
}

/** The onnxruntime module of a backend; a BundleError names the package to install when it is missing. */
export declare function onnxRuntime(backend: Backend): Promise<OrtModuleWithWasm>;

/** Session options that pin onnxruntime to `threads` intra-op threads on either backend. */
export declare function sessionOptions(ort: OrtModuleWithWasm, backend: Backend, threads: number): object;

/** A QuestionAnswerer on a bundle folder (qa_config.json, tokenizer.json or vocab.txt, the ONNX model). */
export declare function loadBundle(bundleDir: string, options?: LoadBundleOptions): Promise<QuestionAnswerer>;
