#!/usr/bin/env python3
"""Reference for test_tokenizer_spm.cpp: sentencepiece itself.

  ref_spm.py train CORPUS VOCAB_SIZE OUT_DIR
      trains a BPE model with byte fallback (identity normalisation, dummy prefix, spaces kept)
      and writes OUT_DIR/vocab.json: {"pieces", "scores", "types"} with GGUF's type numbers.
  ref_spm.py encode OUT_DIR STRINGS_JSON OUT_JSON
      writes {"ids": [...], "decoded": [...]} per string (decode of sentencepiece's own ids).
"""
import json
import os
import sys

import sentencepiece as spm


def train(corpus, vocab_size, out_dir):
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out_dir, "m"), vocab_size=int(vocab_size), model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out_dir, "m.model"))
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        pieces.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_unused(i):
            t = 5
        elif sp.is_byte(i):
            t = 6
        else:
            t = 1
        types.append(t)
    json.dump({"pieces": pieces, "scores": scores, "types": types, "bos": sp.bos_id(), "eos": sp.eos_id(),
               "unk": sp.unk_id()}, open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8"),
              ensure_ascii=False)


def encode(out_dir, strings_path, out_path):
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out_dir, "m.model"))
    res = []
    for s in json.load(open(strings_path, encoding="utf-8")):
        ids = sp.encode(s)
        res.append({"ids": ids, "decoded": sp.decode(ids)})
    json.dump(res, open(out_path, "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(__doc__)
