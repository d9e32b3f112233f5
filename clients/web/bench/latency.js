// Latency of one ONNX question-answering session, the same code in Node (scripts/bench.mjs) and in a page
// (bench/bench.js): batch 1, every token attended, p50/p90 of session.run over timed runs after warm-up ones.
// performance.now() exists in both; in a cross-origin-isolated page Chromium gives it 5 µs resolution.
// Not part of the npm package (package.json "files"): only the latency page and scripts/bench.mjs use it.

/** numpy.percentile's default (linear interpolation between the closest ranks). */
export function percentile(values, q) {
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (q / 100) * (sorted.length - 1);
  const low = Math.floor(rank);
  const high = Math.ceil(rank);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

/** A seeded batch-1 input of `length` random token ids in [5, vocabSize) (ids below 5 are special tokens). */
export function syntheticFeeds(ort, inputNames, length, vocabSize, seed = 0) {
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

/** p50 and p90 in ms of `runs` timed session.run calls after `warmup` untimed ones. */
export async function timeRuns(session, feeds, runs, warmup) {
  for (let i = 0; i < warmup; i += 1) await session.run(feeds);
  const times = [];
  for (let i = 0; i < runs; i += 1) {
    const start = performance.now();
    await session.run(feeds);
    times.push(performance.now() - start);
  }
  const round = (value) => Math.round(value * 1000) / 1000;
  return { p50: round(percentile(times, 50)), p90: round(percentile(times, 90)) };
}

/**
 * Latency at every length: {seqL: {threadsT: {p50, p90}}}, null where the model has fewer positions than L.
 * `threads` only labels the figures: the session was created with it.
 */
export async function timeLengths(ort, session, { lengths, vocabSize, maxPositions = Infinity, runs, warmup, threads }) {
  const latency = {};
  for (const length of lengths) {
    if (length > maxPositions) {
      latency[`seq${length}`] = null; // the model has fewer positions than this length
      continue;
    }
    const feeds = syntheticFeeds(ort, session.inputNames, length, vocabSize);
    latency[`seq${length}`] = { [`threads${threads}`]: await timeRuns(session, feeds, runs, warmup) };
  }
  return latency;
}
