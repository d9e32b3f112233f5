// The latency statistics the Node and browser timings share (bench/latency.js, outside the package).
import assert from "node:assert/strict";
import { test } from "node:test";
import { percentile } from "../bench/latency.js";

test("percentiles interpolate between ranks as numpy.percentile does", () => {
  assert.equal(percentile([4, 1, 3, 2], 50), 2.5);
  assert.equal(percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90), 9.1);
  assert.equal(percentile([7], 90), 7);
});
