// Tokenize texts with the JavaScript tokenizer: reads a JSON list of strings on stdin, prints a JSON list of
// {ids, offsets} (offsets in code points). Used by the parity tests against Python's tokenizers.
//   node scripts/encode.mjs --tokenizer path/to/tokenizer.json < texts.json
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { BertTokenizer } from "../src/tokenizer.js";

const { values } = parseArgs({ options: { tokenizer: { type: "string" } } });
if (!values.tokenizer) {
  console.error("error: --tokenizer FILE is required");
  process.exit(2);
}
const tokenizer = BertTokenizer.fromTokenizerJson(JSON.parse(readFileSync(values.tokenizer, "utf8")), values.tokenizer);
const texts = JSON.parse(readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(texts.map((text) => tokenizer.encode(text))));
