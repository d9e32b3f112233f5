// The page's thread choice and the latency statistics the Node and browser timings share.
import assert from "node:assert/strict";
import { test } from "node:test";
import { defaultThreads } from "../src/browser.js";
import { percentile } from "../src/latency.js";

test("a page asks for every core only when it is cross-origin isolated", () => {
  assert.equal(defaultThreads({ crossOriginIsolated: true, navigator: { hardwareConcurrency: 8 } }), 8);
  assert.equal(defaultThreads({ crossOriginIsolated: false, navigator: { hardwareConcurrency: 8 } }), 1);
  assert.equal(defaultThreads({ crossOriginIsolated: true, navigator: {} }), 1);
  assert.equal(defaultThreads({}), 1);
});

test("percentiles interpolate between ranks as numpy.percentile does", () => {
  assert.equal(percentile([4, 1, 3, 2], 50), 2.5);
  assert.equal(percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90), 9.1);
  assert.equal(percentile([7], 90), 7);
});
