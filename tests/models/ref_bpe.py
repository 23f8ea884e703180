#!/usr/bin/env python3
"""Reference byte-level BPE for test_tokenizer_bpe.cpp, written from GPT-2's encoder.py algorithm
(bytes_to_unicode, get_pairs, merge the lowest-rank pair until none applies) with the `regex`
module for the pre-tokenizer; independent of the C++ code.

  ref_bpe.py train CORPUS PATTERNS_JSON N_MERGES MERGE_FORM OUT_TOKENIZER_JSON
      learns merges from CORPUS (most frequent pair, ties by the pair's text) and writes a
      tokenizer.json: 256 byte characters, the merges' results, then added tokens.
  ref_bpe.py encode TOKENIZER_JSON STRINGS_JSON OUT_JSON
      writes the ids of each string (special tokens split out first, longest first).
"""
import json
import sys

import regex

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


B2U = bytes_to_unicode()


def split_isolated(pattern, pieces):
    out = []
    for p in pieces:
        last = 0
        for m in regex.finditer(pattern, p):
            if m.start() > last:
                out.append(p[last:m.start()])
            if m.end() > m.start():
                out.append(m.group(0))
            last = m.end()
        if last < len(p):
            out.append(p[last:])
    return out


def pre_tokenize(patterns, text):
    pieces = [text] if text else []
    for pat in patterns:
        pieces = split_isolated(pat, pieces)
    return pieces


def to_symbols(word):
    return "".join(B2U[b] for b in word.encode("utf-8"))


def get_pairs(word):
    return set(zip(word, word[1:]))


def bpe(token, ranks):
    word = tuple(token)
    if len(word) < 2:
        return list(word)
    while True:
        pairs = get_pairs(word)
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        first, second = best
        new, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                new.append(first + second)
                i += 2
            else:
                new.append(word[i])
                i += 1
        word = tuple(new)
        if len(word) == 1:
            break
    return list(word)


def patterns_of(tok):
    pats = []

    def walk(pt):
        if pt is None:
            return
        t = pt.get("type")
        if t == "Sequence":
            for p in pt["pretokenizers"]:
                walk(p)
        elif t == "Split":
            pats.append(pt["pattern"]["Regex"])
        elif t == "ByteLevel":
            if pt.get("use_regex", True):
                pats.append(GPT2)
        elif t == "Digits":
            pats.append(r"\p{N}" if pt.get("individual_digits") else r"\p{N}+")
        else:
            raise SystemExit("unknown pre-tokenizer " + str(t))

    walk(tok.get("pre_tokenizer"))
    return pats


def train(corpus_path, patterns_json, n_merges, form, out_path):
    patterns = json.loads(open(patterns_json, encoding="utf-8").read())
    text = open(corpus_path, encoding="utf-8").read()
    counts = {}
    for w in pre_tokenize(patterns, text):
        s = tuple(to_symbols(w))
        counts[s] = counts.get(s, 0) + 1
    vocab = {}
    for b in range(256):
        vocab[B2U[b]] = len(vocab)
    merges = []
    words = dict(counts)
    for _ in range(n_merges):
        pc = {}
        for w, c in words.items():
            for p in zip(w, w[1:]):
                pc[p] = pc.get(p, 0) + c
        if not pc:
            break
        best = max(pc.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if best[0] + best[1] in vocab:
            # Already a token by another split: still a valid merge rule.
            pass
        else:
            vocab[best[0] + best[1]] = len(vocab)
        merges.append(best)
        nw = {}
        for w, c in words.items():
            new, i = [], 0
            while i < len(w):
                if i < len(w) - 1 and (w[i], w[i + 1]) == best:
                    new.append(w[i] + w[i + 1])
                    i += 2
                else:
                    new.append(w[i])
                    i += 1
            nw[tuple(new)] = nw.get(tuple(new), 0) + c
        words = nw
    added = []
    for content, special in [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                             ("<|im_start|>x", True), ("<tool>", False)]:
        added.append({"id": len(vocab) + len(added), "content": content, "special": special})
    if len(patterns) == 1 and patterns[0] == GPT2:
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        seq = []
        for p in patterns:
            if p == r"\p{N}":
                seq.append({"type": "Digits", "individual_digits": True})
            elif p == GPT2:
                seq.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True})
            else:
                seq.append({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False})
        if seq[-1]["type"] != "ByteLevel":
            seq.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
        pre = {"type": "Sequence", "pretokenizers": seq}
    tok = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": form == "pairs",
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges] if form == "pairs" else [a + " " + b for a, b in merges],
        },
    }
    json.dump(tok, open(out_path, "w", encoding="utf-8"), ensure_ascii=False)


def encode(tok_path, strings_path, out_path):
    tok = json.load(open(tok_path, encoding="utf-8"))
    model = tok["model"]
    vocab = model["vocab"]
    for a in tok["added_tokens"]:
        vocab[a["content"]] = a["id"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    ranks = {}
    for i, m in enumerate(merges):
        ranks.setdefault(m, i)
    ignore_merges = model.get("ignore_merges", False)
    patterns = patterns_of(tok)
    specials = sorted((a["content"] for a in tok["added_tokens"]), key=len, reverse=True)
    special_re = regex.compile("|".join(regex.escape(s) for s in specials)) if specials else None
    out = []
    for s in json.load(open(strings_path, encoding="utf-8")):
        ids = []
        parts = []
        last = 0
        if special_re:
            for m in special_re.finditer(s):
                parts.append((s[last:m.start()], False))
                parts.append((m.group(0), True))
                last = m.end()
        parts.append((s[last:], False))
        for text, special in parts:
            if special:
                ids.append(vocab[text])
                continue
            for w in pre_tokenize(patterns, text):
                sym = to_symbols(w)
                if ignore_merges and sym in vocab:
                    ids.append(vocab[sym])
                    continue
                ids.extend(vocab[t] for t in bpe(sym, ranks))
        out.append(ids)
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
    elif sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(__doc__)
