#!/usr/bin/env python3
"""Single-thread encode throughput of HF `tokenizers` on the corpora that fern's tokenizer bench reads.

  python3 tools/tokenizer/bench_hf.py --tokenizer FILE --corpus-dir DIR [--write-corpus]

--write-corpus first writes DIR/mixed.jsonl (generated English/code/multilingual documents, corpus.py) and
DIR/pysrc.jsonl (the installed `transformers` package's .py files in sorted order, up to 16 MB), one JSON string
per line. Both sides then encode the same documents one at a time. Prints one JSON line per corpus.
"""
import argparse
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before importing tokenizers: its thread pool then has one worker
os.environ["TOKENIZERS_PARALLELISM"] = "false"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def write_corpus(d):
    from corpus import bench_documents
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "mixed.jsonl"), "w", encoding="utf-8") as f:
        for doc in bench_documents():
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    import transformers
    root = os.path.dirname(transformers.__file__)
    paths = []
    for dp, dn, fn in os.walk(root):
        dn.sort()
        paths += [os.path.join(dp, x) for x in sorted(fn) if x.endswith(".py")]
    paths.sort()
    total = 0
    with open(os.path.join(d, "pysrc.jsonl"), "w", encoding="utf-8") as f:
        for p in paths:
            try:
                text = open(p, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            f.write(json.dumps(text, ensure_ascii=False) + "\n")
            total += len(text.encode())
            if total > 16 << 20:
                break


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus-dir", required=True)
    ap.add_argument("--write-corpus", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.write_corpus:
        write_corpus(args.corpus_dir)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    for name in ("mixed", "pysrc"):
        docs = [json.loads(line) for line in open(os.path.join(args.corpus_dir, name + ".jsonl"), encoding="utf-8")]
        nbytes = sum(len(d.encode()) for d in docs)
        best, ntok = 1e30, 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ntok = 0
            for d in docs:
                ntok += len(tok.encode(d, add_special_tokens=False).ids)
            best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        nb = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
        tb = time.perf_counter() - t0
        print(json.dumps({"impl": "hf-tokenizers", "corpus": name, "docs": len(docs), "bytes": nbytes, "tokens": ntok,
                          "best_s": round(best, 4), "MB_per_s": round(nbytes / best / 1e6, 2),
                          "batch_1thread_MB_per_s": round(nbytes / tb / 1e6, 2), "batch_tokens_equal": nb == ntok}))


if __name__ == "__main__":
    main()
