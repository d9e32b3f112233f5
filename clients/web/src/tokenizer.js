// BERT tokenization with character offsets: the BertNormalizer + BertPreTokenizer + WordPiece of a
// tokenizer.json (or a vocab.txt with the normalizer flags), giving the ids and offsets that the Python
// `tokenizers` library gives for the same file.
//
// Offsets count Unicode code points of the original text, as Python's str indices do (a JavaScript string
// index counts UTF-16 units: an emoji is one code point but two units). Use codePointSlice() to cut text, or
// utf16IndexOfCodePoints() to turn them into string indices.

/** A tokenizer file that is not a BERT WordPiece tokenizer this client reads. */
export class TokenizerError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "TokenizerError";
  }
}

// Rust's char::is_whitespace is Unicode's White_Space property; tab, newline and carriage return are
// controls that BERT cleaning treats as whitespace.
const WHITESPACE = /^\p{White_Space}$/u;
// Controls, format characters, private use and surrogates: BERT cleaning drops them. Unassigned code points
// (Cn) are kept, as huggingface/tokenizers keeps them.
const CONTROL = /^[\p{Cc}\p{Cf}\p{Co}\p{Cs}]$/u;
const NONSPACING_MARK = /^\p{Mn}$/u;
const UNICODE_PUNCTUATION = /^\p{P}$/u;
const ASCII_PUNCTUATION = new Set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~");

// The CJK ideograph blocks that BertNormalizer isolates (as in huggingface/tokenizers' bert normalizer).
const CJK_RANGES = [
  [0x4e00, 0x9fff], [0x3400, 0x4dbf], [0x20000, 0x2a6df], [0x2a700, 0x2b73f],
  [0x2b740, 0x2b81f], [0x2b920, 0x2ceaf], [0xf900, 0xfaff], [0x2f800, 0x2fa1f],
];

function isWhitespace(char) {
  return WHITESPACE.test(char);
}

function isControl(char) {
  if (char === "\t" || char === "\n" || char === "\r") return false;
  return CONTROL.test(char);
}

function isChineseChar(codePoint) {
  for (const [low, high] of CJK_RANGES) {
    if (codePoint >= low && codePoint <= high) return true;
  }
  return false;
}

function isPunctuation(char) {
  return ASCII_PUNCTUATION.has(char) || UNICODE_PUNCTUATION.test(char);
}

/** The code points of a string, one string each (an emoji is one entry, not two UTF-16 halves). */
export function codePoints(text) {
  return Array.from(text);
}

/** text[start:end] where start and end count code points, as Python slices a str. */
export function codePointSlice(text, start, end) {
  return codePoints(text).slice(start, end).join("");
}

/**
 * The UTF-16 index (a JavaScript string index) of every code point boundary of `text`: entry i is where code
 * point i starts, the last entry (index = number of code points) is text.length.
 * text.slice(u[start], u[end]) === codePointSlice(text, start, end).
 */
export function utf16IndexOfCodePoints(text) {
  const indices = [0];
  let index = 0;
  for (const char of text) {
    index += char.length; // 2 for a character outside the Basic Multilingual Plane (a surrogate pair), else 1
    indices.push(index);
  }
  return indices;
}

export class BertTokenizer {
  /**
   * @param {object} options
   * @param {Map<string, number>} options.vocab token -> id
   * @param {boolean} options.lowercase
   * @param {boolean} options.stripAccents
   * @param {boolean} [options.cleanText]
   * @param {boolean} [options.handleChineseChars]
   * @param {string} [options.unkToken]
   * @param {string} [options.continuingSubwordPrefix]
   * @param {number} [options.maxInputCharsPerWord]
   * @param {Array<{content: string, id: number}>} [options.addedTokens] matched on the raw text first
   * @param {{cls: string, sep: string, pad: string}} [options.specialTokens]
   */
  constructor(options) {
    this.vocab = options.vocab;
    this.lowercase = options.lowercase;
    this.stripAccents = options.stripAccents;
    this.cleanText = options.cleanText ?? true;
    this.handleChineseChars = options.handleChineseChars ?? true;
    this.unkToken = options.unkToken ?? "[UNK]";
    this.prefix = options.continuingSubwordPrefix ?? "##";
    this.maxInputCharsPerWord = options.maxInputCharsPerWord ?? 100;
    // Longest first, so that at one position the longest added token wins (leftmost-longest matching).
    this.addedTokens = [...(options.addedTokens ?? [])]
      .map((token) => ({ content: token.content, chars: codePoints(token.content), id: token.id }))
      .sort((a, b) => b.chars.length - a.chars.length);
    const special = options.specialTokens ?? { cls: "[CLS]", sep: "[SEP]", pad: "[PAD]" };
    this.clsId = this.requireId(special.cls);
    this.sepId = this.requireId(special.sep);
    this.padId = this.requireId(special.pad);
    this.unkId = this.requireId(this.unkToken);
  }

  requireId(token) {
    const id = this.vocab.get(token);
    if (id === undefined) throw new TokenizerError(`the vocabulary has no ${token} token`);
    return id;
  }

  /** A tokenizer from the parsed tokenizer.json of a BERT WordPiece tokenizer; `source` names it in errors. */
  static fromTokenizerJson(json, source = "tokenizer.json") {
    const model = json.model ?? {};
    if (model.type !== "WordPiece") {
      throw new TokenizerError(`${source}: model.type is ${JSON.stringify(model.type)}, expected "WordPiece"`);
    }
    const normalizer = json.normalizer ?? {};
    if (normalizer.type !== "BertNormalizer") {
      throw new TokenizerError(`${source}: normalizer.type is ${JSON.stringify(normalizer.type)}, expected "BertNormalizer"`);
    }
    if (json.pre_tokenizer?.type !== "BertPreTokenizer") {
      throw new TokenizerError(
        `${source}: pre_tokenizer.type is ${JSON.stringify(json.pre_tokenizer?.type)}, expected "BertPreTokenizer"`,
      );
    }
    const vocab = new Map(Object.entries(model.vocab ?? {}));
    const addedTokens = [];
    for (const token of json.added_tokens ?? []) {
      if (token.normalized || token.single_word || token.lstrip || token.rstrip) {
        throw new TokenizerError(
          `${source}: added token ${JSON.stringify(token.content)} uses normalized/single_word/lstrip/rstrip, not supported`,
        );
      }
      addedTokens.push({ content: token.content, id: token.id });
      vocab.set(token.content, token.id);
    }
    const lowercase = normalizer.lowercase ?? true;
    return new BertTokenizer({
      vocab,
      lowercase,
      // BertNormalizer: strip_accents unset follows lowercase.
      stripAccents: normalizer.strip_accents ?? lowercase,
      cleanText: normalizer.clean_text ?? true,
      handleChineseChars: normalizer.handle_chinese_chars ?? true,
      unkToken: model.unk_token ?? "[UNK]",
      continuingSubwordPrefix: model.continuing_subword_prefix ?? "##",
      maxInputCharsPerWord: model.max_input_chars_per_word ?? 100,
      addedTokens,
      specialTokens: specialTokensOf(json.post_processor, source),
    });
  }

  /** A tokenizer from vocab.txt (one token a line, id = line number) and the normalizer flags. */
  static fromVocabText(text, { lowercase, stripAccents, specialTokens } = {}, source = "vocab.txt") {
    if (typeof lowercase !== "boolean" || typeof stripAccents !== "boolean") {
      throw new TokenizerError(`${source}: lowercase and strip_accents must be given as booleans`);
    }
    const vocab = new Map();
    const lines = text.split("\n");
    if (lines.at(-1) === "") lines.pop();
    lines.forEach((line, id) => vocab.set(line.replace(/\r$/, ""), id));
    const names = specialTokens ?? { cls: "[CLS]", sep: "[SEP]", pad: "[PAD]", unk: "[UNK]" };
    const special = Object.values(names).filter((token) => vocab.has(token));
    const addedTokens = [...new Set([...special, "[MASK]"])].filter((t) => vocab.has(t)).map((t) => ({ content: t, id: vocab.get(t) }));
    return new BertTokenizer({
      vocab, lowercase, stripAccents, addedTokens, unkToken: names.unk ?? "[UNK]",
      specialTokens: { cls: names.cls, sep: names.sep, pad: names.pad },
    });
  }

  /**
   * Token ids and offsets of one text, without special tokens.
   * @returns {{ids: number[], offsets: Array<[number, number]>}} offsets in code points of `text`
   */
  encode(text) {
    const chars = codePoints(text);
    const ids = [];
    const offsets = [];
    let segmentStart = 0;
    let position = 0;
    while (position < chars.length) {
      const added = this.addedTokenAt(chars, position);
      if (added === null) {
        position += 1;
        continue;
      }
      this.encodeSegment(chars, segmentStart, position, ids, offsets);
      ids.push(added.id);
      offsets.push([position, position + added.chars.length]);
      position += added.chars.length;
      segmentStart = position;
    }
    this.encodeSegment(chars, segmentStart, chars.length, ids, offsets);
    return { ids, offsets };
  }

  addedTokenAt(chars, position) {
    for (const token of this.addedTokens) {
      if (token.chars.length === 0 || position + token.chars.length > chars.length) continue;
      let matches = true;
      for (let k = 0; k < token.chars.length && matches; k += 1) matches = chars[position + k] === token.chars[k];
      if (matches) return token;
    }
    return null;
  }

  encodeSegment(chars, begin, end, ids, offsets) {
    const { normalized, origin } = this.normalize(chars, begin, end);
    for (const [wordStart, wordEnd] of preTokenize(normalized)) {
      this.wordPiece(normalized, origin, wordStart, wordEnd, ids, offsets);
    }
  }

  /** BertNormalizer; origin[i] is the index in `chars` of the character normalized[i] came from. */
  normalize(chars, begin, end) {
    const normalized = [];
    const origin = [];
    const emit = (char, index) => {
      normalized.push(char);
      origin.push(index);
    };
    for (let index = begin; index < end; index += 1) {
      let char = chars[index];
      const codePoint = char.codePointAt(0);
      if (this.cleanText) {
        if (codePoint === 0 || codePoint === 0xfffd || isControl(char)) continue;
        if (isWhitespace(char)) char = " ";
      }
      const pieces = this.handleChineseChars && isChineseChar(codePoint) ? [" ", char, " "] : [char];
      for (const piece of pieces) {
        let decomposed = [piece];
        if (this.stripAccents) {
          decomposed = codePoints(piece.normalize("NFD")).filter((c) => !NONSPACING_MARK.test(c));
        }
        for (const kept of decomposed) {
          // One character may lowercase to several (İ -> i + combining dot): each maps to the same origin.
          const lowered = this.lowercase ? codePoints(kept.toLowerCase()) : [kept];
          for (const out of lowered) emit(out, index);
        }
      }
    }
    return { normalized, origin };
  }

  /** Greedy longest-match-first WordPiece of normalized[wordStart:wordEnd]. */
  wordPiece(normalized, origin, wordStart, wordEnd, ids, offsets) {
    const wordOffsets = (from, to) => [origin[from], origin[to - 1] + 1];
    if (wordEnd - wordStart > this.maxInputCharsPerWord) {
      ids.push(this.unkId);
      offsets.push(wordOffsets(wordStart, wordEnd));
      return;
    }
    const pieceIds = [];
    const pieceOffsets = [];
    let start = wordStart;
    while (start < wordEnd) {
      let end = wordEnd;
      let found = null;
      while (start < end) {
        let piece = normalized.slice(start, end).join("");
        if (start > wordStart) piece = this.prefix + piece;
        const id = this.vocab.get(piece);
        if (id !== undefined) {
          found = id;
          break;
        }
        end -= 1;
      }
      if (found === null) {
        // No piece matches: the whole word is one unknown token.
        ids.push(this.unkId);
        offsets.push(wordOffsets(wordStart, wordEnd));
        return;
      }
      pieceIds.push(found);
      pieceOffsets.push(wordOffsets(start, end));
      start = end;
    }
    ids.push(...pieceIds);
    offsets.push(...pieceOffsets);
  }
}

/** BertPreTokenizer: split on whitespace (dropped) and around every punctuation character (kept alone). */
function preTokenize(normalized) {
  const words = [];
  let start = -1;
  for (let i = 0; i < normalized.length; i += 1) {
    const char = normalized[i];
    if (isWhitespace(char)) {
      if (start >= 0) words.push([start, i]);
      start = -1;
    } else if (isPunctuation(char)) {
      if (start >= 0) words.push([start, i]);
      words.push([i, i + 1]);
      start = -1;
    } else if (start < 0) {
      start = i;
    }
  }
  if (start >= 0) words.push([start, normalized.length]);
  return words;
}

function specialTokensOf(postProcessor, source) {
  if (!postProcessor) return { cls: "[CLS]", sep: "[SEP]", pad: "[PAD]" };
  if (postProcessor.type === "BertProcessing") {
    return { cls: postProcessor.cls[0], sep: postProcessor.sep[0], pad: "[PAD]" };
  }
  if (postProcessor.type === "TemplateProcessing") {
    const pair = (postProcessor.pair ?? []).map((item) => item.SpecialToken?.id ?? (item.Sequence ? `$${item.Sequence.id}` : "?"));
    if (pair.length !== 5 || pair[1] !== "$A" || pair[3] !== "$B" || pair[2] !== pair[4]) {
      throw new TokenizerError(`${source}: post_processor.pair is ${JSON.stringify(pair)}, expected [CLS] $A [SEP] $B [SEP]`);
    }
    return { cls: pair[0], sep: pair[2], pad: "[PAD]" };
  }
  throw new TokenizerError(`${source}: post_processor.type ${JSON.stringify(postProcessor.type)} is not supported`);
}
