// Latency of one ONNX question-answering model in onnxruntime-node or onnxruntime-web (WebAssembly):
// batch 1, every token attended, p50/p90 over --runs timed runs after --warmup untimed ones, 1 thread.
//   node scripts/bench.mjs --model FILE --backend node|web --lengths 128,384 --vocab-size N
//        [--max-positions N] [--runs 20] [--warmup 3] [--threads 1] --out FILE
// Lengths beyond --max-positions get null (the model has no positions for them). The output holds
// {backend, runtime, node, latency_ms: {seqL: {threadsT: {p50, p90}} | null}, peak_rss_mb}.
import { renameSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { parseArgs } from "node:util";
import { onnxRuntime, sessionOptions } from "../src/node.js";

/** numpy.percentile's default (linear interpolation between the closest ranks). */
export function percentile(values, q) {
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (q / 100) * (sorted.length - 1);
  const low = Math.floor(rank);
  const high = Math.ceil(rank);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

/** A seeded batch-1 input of `length` random token ids in [5, vocabSize) (ids below 5 are special tokens). */
function syntheticFeeds(ort, inputNames, length, vocabSize, seed = 0) {
  let state = seed + 1;
  const random = () => {
    state = (state * 1103515245 + 12345) % 2147483648;
    return state / 2147483648;
  };
  const feeds = {};
  for (const name of inputNames) {
    const data = new BigInt64Array(length);
    for (let i = 0; i < length; i += 1) {
      if (name === "input_ids") data[i] = BigInt(5 + Math.floor(random() * (vocabSize - 5)));
      else if (name === "attention_mask") data[i] = 1n;
    }
    feeds[name] = new ort.Tensor("int64", data, [1, length]);
  }
  return feeds;
}

async function timeRuns(session, feeds, runs, warmup) {
  for (let i = 0; i < warmup; i += 1) await session.run(feeds);
  const times = [];
  for (let i = 0; i < runs; i += 1) {
    const start = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  const round = (value) => Math.round(value * 1000) / 1000;
  return { p50: round(percentile(times, 50)), p90: round(percentile(times, 90)) };
}

async function main() {
  const { values } = parseArgs({
    options: {
      model: { type: "string" }, backend: { type: "string", default: "node" }, lengths: { type: "string", default: "128,384" },
      "vocab-size": { type: "string" }, "max-positions": { type: "string" }, runs: { type: "string", default: "20" },
      warmup: { type: "string", default: "3" }, threads: { type: "string", default: "1" }, out: { type: "string" },
    },
  });
  if (!values.model || !values.out || !values["vocab-size"]) {
    console.error("error: --model FILE, --vocab-size N and --out FILE are required");
    process.exit(2);
  }
  const lengths = values.lengths.split(",").map(Number);
  const threads = Number(values.threads);
  const maxPositions = values["max-positions"] ? Number(values["max-positions"]) : Infinity;
  const ort = await onnxRuntime(values.backend);
  const model = await readFile(values.model);
  const session = await ort.InferenceSession.create(new Uint8Array(model), sessionOptions(ort, values.backend, threads));
  const latency = {};
  for (const length of lengths) {
    if (length > maxPositions) {
      latency[`seq${length}`] = null; // the model has fewer positions than this length
      continue;
    }
    const feeds = syntheticFeeds(ort, session.inputNames, length, Number(values["vocab-size"]));
    latency[`seq${length}`] = { [`threads${threads}`]: await timeRuns(session, feeds, Number(values.runs), Number(values.warmup)) };
  }
  const runtime = values.backend === "web"
    ? `onnxruntime-web ${ort.env.versions.web} (WebAssembly, ${threads} thread${threads === 1 ? "" : "s"}, in Node ${process.versions.node})`
    : `onnxruntime-node ${ort.env.versions.node} (native CPU, ${threads} thread${threads === 1 ? "" : "s"})`;
  const result = {
    backend: values.backend, runtime, node: process.versions.node, latency_ms: latency,
    peak_rss_mb: Math.round(process.resourceUsage().maxRSS / 102.4) / 10, // maxRSS is in kB
  };
  writeFileSync(`${values.out}.partial`, JSON.stringify(result, null, 1));
  renameSync(`${values.out}.partial`, values.out);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((error) => {
    console.error(`error: ${error.message}`);
    process.exit(1);
  });
}
