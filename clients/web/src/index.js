// The bundle client's platform-free core (no Node or DOM calls): pass in the onnxruntime module your platform
// has (onnxruntime-node, onnxruntime-web or onnxruntime-react-native).
export { QuestionAnswerer, BundleError, parseQaConfig, questionBatches, tokenizerFromBundleFiles } from "./answerer.js";
export { BertTokenizer, TokenizerError, codePoints, codePointSlice, utf16IndexOfCodePoints } from "./tokenizer.js";
export { nBestAnswers } from "./squad.js";
