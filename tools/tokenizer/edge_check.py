#!/usr/bin/env python3
"""Encodes a few edge strings with HF tokenizers and with `fern tokenize --jsonl` and prints any difference
(NFC across an added-token boundary, Unicode whitespace, case folding of the contractions, Kelvin sign...)."""
import argparse
import json
import subprocess

EDGE = ["<think>\u0338", ">\u0338", "a\u0338", "x\u0085y", "\u0085", "'\u017f", "'\u212a", "it'\u017f", "\u180e",
        "a\u200bb", "\u2028\u2029", "\U0001F1FA\U0001F1F8\u200d", "\u0E01\u0E31\u0E49", "<|im_end|>\u0301",
        "\u1100\u1161<think>\u11a8", "\u00a0\u00a0x", "\t\t\n\n  \n", "١٢٣", "\u3000\u3000日本"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--fern", required=True)
    a = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    inp = "".join(json.dumps(s) + "\n" for s in EDGE)
    out = subprocess.run([a.fern, "tokenize", "--tokenizer", a.tokenizer, "--jsonl"], input=inp.encode(),
                         capture_output=True, check=True).stdout.decode().splitlines()
    bad = 0
    for s, line in zip(EDGE, out):
        hf = tok.encode(s, add_special_tokens=False).ids
        fe = json.loads(line)
        if hf != fe:
            bad += 1
            print("DIFF", json.dumps(s), "hf", hf, "fern", fe)
        dec = tok.decode(hf)
        print("ok" if hf == fe else "--", json.dumps(s), hf, "decode", json.dumps(dec))
    print(json.dumps({"edge_strings": len(EDGE), "differ": bad}))


if __name__ == "__main__":
    main()
