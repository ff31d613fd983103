"""Deterministic test strings for the tokenizer differential test (no network, no data files).

Every category named in issue 3 is generated from a seeded random.Random, so the same strings come out on any
machine. Random code points are restricted to characters that were already assigned in Unicode 3.2 (and are not
surrogates or private use), because the regex engines and normalisers compared here ship different Unicode
versions; characters assigned later could legitimately differ between them.
"""
import random
import unicodedata

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part over new sound take only little work know place year live me back give most very "
         "after thing our just name good sentence man think say great where help through much before line right "
         "too mean old any same tell boy follow came want show also around form three small set put end does "
         "another well large must big even such because turn here why ask went men read need land different home "
         "us move try kind hand picture again change off play spell air away animal house point page letter "
         "mother answer found study still learn should America world HTTP JSON GPU tokenizer Qwen naïve café "
         "résumé coöperate façade Straße").split()

CODE_SNIPPETS = [
    "def {f}({a}, {b}=None):\n    if {a} is None:\n        return []\n    return [x * 2 for x in {a}]\n",
    "for (int i = 0; i < {n}; ++i) {{\n\tsum += v[i] * w[i];\n}}\n",
    "const {f} = async ({a}) => {{ await fetch(`/api/${{{a}}}`); }};",
    "#include <vector>\nint main() {{ std::vector<int> {a}({n}); return {a}.size() > 0 ? 0 : 1; }}\n",
    '{{"name": "{f}", "args": {{"{a}": {n}, "{b}": [1, 2.5, null, true]}}}}',
    "SELECT {a}, COUNT(*) FROM {f} WHERE {b} >= {n} GROUP BY {a};",
    "    if ({a} != {b}) {{\n        throw std::runtime_error(\"bad {f}\");\n    }}\n",
    "$ ls -la /usr/lib | grep -E '^d' && echo \"done: {n}\"\n",
    "<div class=\"{f}\"><span id='{a}'>{b}</span></div>\r\n",
    "x = {n}; y = x ** 2 // 3 % 7 - ~x ^ 0xFF & 0b1010 | 0o17\n",
    "fn {f}(&mut self, {a}: u32) -> Result<(), Box<dyn Error>> {{ Ok(()) }}",
    "    \"\"\"Docstring for {f}.\n\n    Args:\n        {a}: the input.\n    \"\"\"\n",
    "// TODO({a}): handle {b} when n == {n}\n/* block\n * comment */\n",
]

WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\u00a0", "\u3000",
              "\u2009", "\u200a", "\x0b", "\x0c", "\u0085", "\u2028", "\u2029", "\u1680", "\u202f", "    \n\n    "]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|box_end|>", "<|vision_pad|>",
            "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
            "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
            "<think>", "</think>"]
NEAR_SPECIALS = ["<|im_start", "<|im_start|", "im_start|>", "<|im_end||>", "<<|im_end|>>", "< think>", "<think >",
                 "</think", "<|endoftext", "<tool_call", "<|IM_START|>", "<Think>", "</s>", "<s>", "<|", "|>"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
EMOJI = ["😀", "👍", "👍🏽", "👍🏿", "❤️", "❤", "🇫🇷", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀",
         "🏳️‍🌈", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "🤷‍♂️", "🐍", "🚀", "✨", "☕", "⌚", "🙂", "🫠", "🥲", "👁️‍🗨️", "💯", "🔥",
         "©️", "™️", "↔️", "▶️"]

THAI_CONS = [chr(c) for c in range(0x0E01, 0x0E2F)]
THAI_MARKS = ["\u0E31", "\u0E34", "\u0E35", "\u0E36", "\u0E37", "\u0E38", "\u0E39", "\u0E47", "\u0E48", "\u0E49",
              "\u0E4A", "\u0E4B", "\u0E4C"]
THAI_VOWELS = ["\u0E30", "\u0E32", "\u0E33", "\u0E40", "\u0E41", "\u0E42", "\u0E43", "\u0E44"]
DEVA_CONS = [chr(c) for c in range(0x0915, 0x0939)]
DEVA_MATRAS = ["\u093E", "\u093F", "\u0940", "\u0941", "\u0942", "\u0947", "\u0948", "\u094B", "\u094C", "\u0902",
               "\u0901", "\u0903", "\u093C"]
DEVA_VIRAMA = "\u094D"
ARABIC_LET = [chr(c) for c in range(0x0627, 0x063B)] + [chr(c) for c in range(0x0641, 0x064B)]
ARABIC_MARKS = [chr(c) for c in range(0x064B, 0x0653)] + ["\u0670"]
LATIN_MARKS = [chr(c) for c in range(0x0300, 0x0370)]


def _assigned_old(cp):
    """True for a character assigned in Unicode 3.2 and still of the same kind today."""
    if 0xD800 <= cp <= 0xDFFF:
        return False
    ch = chr(cp)
    try:
        old = unicodedata.ucd_3_2_0.category(ch)
    except ValueError:
        return False
    if old in ("Cn", "Co", "Cs"):
        return False
    return unicodedata.category(ch) == old


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        # Pools of old, stable code points by plane region (weights favour the BMP).
        self.pool_bmp = [cp for cp in range(0x20, 0x10000) if _assigned_old(cp)]
        self.pool_smp = [cp for cp in range(0x10000, 0x2FA20) if _assigned_old(cp)]

    def pick(self, seq):
        return self.r.choice(seq)

    def word(self):
        w = self.pick(WORDS)
        x = self.r.random()
        if x < 0.15:
            return w.capitalize()
        if x < 0.2:
            return w.upper()
        return w

    def english(self):
        n = self.r.randint(1, 40)
        out = []
        for i in range(n):
            w = self.word()
            if i == 0:
                w = w.capitalize()
            out.append(w)
            if self.r.random() < 0.1:
                out[-1] += self.pick([",", ";", ":", " -", "...", "!", "?", "'s", "s'", "(s)"])
        s = " ".join(out) + self.pick([".", "!", "?", "", ".\n", "\n\n", " "])
        if self.r.random() < 0.2:
            s = '"' + s + '"'
        return s

    def code(self):
        t = self.pick(CODE_SNIPPETS)
        s = t.format(f=self.pick(["parse", "run_all", "fooBar", "get_x", "Main", "tokenize"]),
                     a=self.pick(["items", "x", "self", "ctx", "argv"]), b=self.pick(["key", "y", "opt", "__init__"]),
                     n=self.r.randint(0, 10 ** self.r.randint(1, 9)))
        if self.r.random() < 0.3:
            s = s.replace("    ", "\t")
        if self.r.random() < 0.3:
            s = "    " * self.r.randint(1, 4) + s
        return s

    def whitespace(self):
        parts = []
        for _ in range(self.r.randint(1, 12)):
            if self.r.random() < 0.5:
                parts.append("".join(self.pick(WHITESPACE) for _ in range(self.r.randint(1, 6))))
            else:
                parts.append(self.pick([self.word(), "!", "()", "1", "—", "x.y", "é", "日本"]))
        return "".join(parts)

    def digits(self):
        forms = [lambda: str(self.r.randint(0, 10 ** 12)), lambda: f"{self.r.uniform(-1e6, 1e6):.{self.r.randint(0, 8)}f}",
                 lambda: f"+1 ({self.r.randint(100, 999)}) {self.r.randint(100, 999)}-{self.r.randint(1000, 9999)}",
                 lambda: f"{self.r.randint(1900, 2100)}-{self.r.randint(1, 12):02d}-{self.r.randint(1, 28):02d}",
                 lambda: "abc" + str(self.r.randint(0, 99999)) + "def", lambda: "٣٤٥٦", lambda: "१२३४", lambda: "１２３",
                 lambda: "x²+y³=z⁴", lambda: "½ ¾ ⅓", lambda: "Ⅻ ⅷ", lambda: "𝟘𝟙𝟚", lambda: f"{self.r.random():e}",
                 lambda: "0x" + "".join(self.pick("0123456789abcdef") for _ in range(self.r.randint(1, 16))),
                 lambda: "1,234,567.89", lambda: "3.14159265358979323846", lambda: "v1.2.3-rc.4"]
        return " ".join(self.pick(forms)() for _ in range(self.r.randint(1, 6)))

    def cjk(self):
        out = []
        for _ in range(self.r.randint(1, 40)):
            x = self.r.random()
            if x < 0.45:
                out.append(chr(self.r.randint(0x4E00, 0x9FA5)))
            elif x < 0.6:
                out.append(chr(self.r.randint(0x3041, 0x3094)))
            elif x < 0.7:
                out.append(chr(self.r.randint(0x30A1, 0x30FA)))
            elif x < 0.82:
                out.append(chr(self.r.randint(0xAC00, 0xD7A3)))
            elif x < 0.92:
                out.append(self.pick(["。", "、", "「", "」", "！", "？", "（", "）", "・", "ー", "，", "：", " "]))
            else:
                out.append(self.pick(["ABC", "123", " ", "GPU", "\n"]))
        return "".join(out)

    def thai(self):
        out = []
        for _ in range(self.r.randint(1, 25)):
            if self.r.random() < 0.2:
                out.append(self.pick(THAI_VOWELS))
            out.append(self.pick(THAI_CONS))
            for _ in range(self.r.choice([0, 0, 1, 1, 2])):
                out.append(self.pick(THAI_MARKS))
            if self.r.random() < 0.1:
                out.append(self.pick([" ", "๑๒๓", "ๆ", "฿", "\n"]))
        return "".join(out)

    def devanagari(self):
        out = []
        for _ in range(self.r.randint(1, 20)):
            out.append(self.pick(DEVA_CONS))
            if self.r.random() < 0.2:
                out.append(DEVA_VIRAMA + self.pick(DEVA_CONS))
            for _ in range(self.r.choice([0, 1, 1, 2])):
                out.append(self.pick(DEVA_MATRAS))
            if self.r.random() < 0.15:
                out.append(self.pick([" ", "।", "॥", " ", "३"]))
        return "".join(out)

    def arabic(self):
        out = []
        for _ in range(self.r.randint(1, 25)):
            out.append(self.pick(ARABIC_LET))
            for _ in range(self.r.choice([0, 0, 1, 2])):
                out.append(self.pick(ARABIC_MARKS))
            if self.r.random() < 0.15:
                out.append(self.pick([" ", "،", "؟", "ـ", "٣", "\u200f", " "]))
        return "".join(out)

    def combining(self):
        out = []
        for _ in range(self.r.randint(1, 12)):
            x = self.r.random()
            if x < 0.5:
                base = self.pick("aeiouAEIOUnNcCsSzZyYwx ")
                out.append(base + "".join(self.pick(LATIN_MARKS) for _ in range(self.r.randint(1, 3))))
            elif x < 0.65:
                # Hangul conjoining jamo: NFC composes L V (T) into one syllable.
                out.append(chr(self.r.randint(0x1100, 0x1112)) + chr(self.r.randint(0x1161, 0x1175)) +
                           (chr(self.r.randint(0x11A8, 0x11C2)) if self.r.random() < 0.5 else ""))
            elif x < 0.75:
                out.append(unicodedata.normalize("NFD", self.pick(["café", "Ångström", "naïve", "ỹ", "Ǻ", "ṩ"])))
            elif x < 0.85:
                out.append(self.pick(LATIN_MARKS))  # a mark with no base (at a word start, after space)
            else:
                out.append(self.pick(["ﬁ", "Å", "Ω", "K", "ｶﾞ", "ﾞ", "\u0344", "\u0958", "\u2126"]))
            if self.r.random() < 0.3:
                out.append(self.pick([" ", "-", "1", "\n", "."]))
        return "".join(out)

    def emoji(self):
        return "".join(self.pick(EMOJI + [" ", " ", "ok", "!", "\n", "1"]) for _ in range(self.r.randint(1, 15)))

    def contractions(self):
        out = []
        for _ in range(self.r.randint(1, 10)):
            w = self.pick(["I", "you", "We", "THEY", "it", "he", "don", "can", "Ma", "rock", "o", ""])
            c = self.pick(CONTRACTIONS)
            c = "".join(ch.upper() if self.r.random() < 0.5 else ch for ch in c)
            if self.r.random() < 0.1:
                c = c.replace("'", "\u2019")
            if self.r.random() < 0.05:
                c = c.replace("s", "\u017f").replace("S", "\u017f")
            out.append(w + c + self.pick(["", "", "s", "t", "'", "''"]))
        return self.pick([" ", "", "  ", "\n"]).join(out)

    def specials(self):
        out = []
        for _ in range(self.r.randint(1, 10)):
            x = self.r.random()
            if x < 0.45:
                out.append(self.pick(SPECIALS))
            elif x < 0.65:
                out.append(self.pick(NEAR_SPECIALS))
            else:
                out.append(self.pick([self.word(), " ", "\n", "hello", "é\u0301", "123", "!"]))
        return "".join(out)

    def random_unicode(self):
        n = self.r.randint(1, 60)
        out = []
        for _ in range(n):
            x = self.r.random()
            if x < 0.7:
                out.append(chr(self.pick(self.pool_bmp)))
            elif x < 0.85:
                out.append(chr(self.pick(self.pool_smp)))
            elif x < 0.95:
                out.append(chr(self.r.randint(0, 0x7F)))
            else:
                out.append(self.pick(WHITESPACE))
        return "".join(out)

    def mixed(self):
        fns = [self.english, self.code, self.cjk, self.thai, self.arabic, self.devanagari, self.emoji, self.digits,
               self.specials, self.contractions, self.combining]
        return self.pick(["", " ", "\n"]).join(self.pick(fns)() for _ in range(self.r.randint(2, 5)))

    def long(self):
        x = self.r.randrange(8)
        n = self.r.randint(500, 6000)
        if x == 0:
            return "a" * n
        if x == 1:
            return " " * n + "x"
        if x == 2:
            return "_" * n
        if x == 3:
            return "\n" * n
        if x == 4:
            return "".join(self.english() + " " for _ in range(n // 100))
        if x == 5:
            return "e" + "\u0301" * (n // 10)
        if x == 6:
            return "".join(self.pick(["ab", "ba", "abc"]) for _ in range(n // 2))
        return "1234567890" * (n // 10)


CATEGORIES = [("english", 500), ("code", 450), ("whitespace", 400), ("digits", 300), ("cjk", 400), ("thai", 300),
              ("devanagari", 300), ("arabic", 300), ("combining", 300), ("emoji", 300), ("contractions", 300),
              ("specials", 300), ("random_unicode", 700), ("mixed", 300), ("long", 40)]


def test_strings(seed=20261130):
    """[(category, text)] — about 5,400 strings, identical on every run."""
    g = Gen(seed)
    out = []
    for name, count in CATEGORIES:
        fn = getattr(g, name)
        for _ in range(count):
            out.append((name, fn()))
    # Hand-picked edge cases.
    for s in ["", " ", "\n", "\r\n", "a", "'s", "'S", "'", "''", "\u00a0", "\u3000", " \u00a0x", "hello  world",
              "hello \n world", "a\n\n\nb", "  leading", "trailing  ", "\t\tindent", "x" + " " * 7 + "y",
              "<|im_start|>", "<|im_start|><|im_end|>", "<|im_start|>user\nHi<|im_end|>\n", "é", "e\u0301",
              "\u1100\u1161\u11a8", "\U0001F600" * 3, "\x00", "a\x00b", "\x7f", "don't", "DON'T", "Y'ALL'RE",
              "<think>\n\n</think>\n\n", "ab" * 50, " ab" * 50, "...", "!!!", "?!?", "$100.00", "1/2"]:
        out.append(("edge", s))
    return out


def bench_documents(seed=7, target_bytes=4 << 20):
    """Mixed-language documents for the speed measurement (multilingual share ~25% of the bytes)."""
    g = Gen(seed)
    docs, total = [], 0
    while total < target_bytes:
        x = g.r.random()
        if x < 0.55:
            d = "\n\n".join(" ".join(g.english() for _ in range(g.r.randint(3, 8))) for _ in range(g.r.randint(2, 6)))
        elif x < 0.8:
            d = "\n".join(g.code() for _ in range(g.r.randint(3, 12)))
        else:
            d = "\n".join(g.pick([g.cjk, g.thai, g.arabic, g.devanagari, g.emoji, g.digits])() for _ in range(10))
        docs.append(d)
        total += len(d.encode())
    return docs
