// The bundle client's platform-free core: pass in the onnxruntime module your platform has.
export { QuestionAnswerer, BundleError, parseQaConfig, tokenizerFromBundleFiles } from "./answerer.js";
export { BertTokenizer, TokenizerError, codePoints, codePointSlice } from "./tokenizer.js";
export { nBestAnswers } from "./squad.js";
