# Side-by-side comparison of fern and HF transformers on the same GPU and the same weights (run on the GPU
# machine, where torch and transformers 5.17 exist). HF gets the dequantized bf16 weights of the same MLX 4-bit
# checkpoint that fern runs. Each round runs both engines, alternating which goes first; medians over rounds.
#
#   python3 bench/compare/compare.py --fern build/fern --ckpt DIR --out compare.json --md compare.md \
#       [--lengths 256,...] [--hf-lengths 256,...] [--rounds 3] [--steps 64]
#
# DIR: an MLX 4-bit checkpoint (e.g. `fern synth --preset qwen3.6-35b-a3b --format mlx4 --out DIR`).
# HF decode at a context L needs a prefill of L tokens first (its cache cannot be filled otherwise), and its Gated
# DeltaNet prefill falls back to PyTorch without the fla package, so --hf-lengths is usually shorter than
# --lengths; missing cells print as "-".
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "golden"))
from hf_golden import ZERO_CENTRED_NORMS, bf16_to_f32, dequant, read_safetensors  # noqa: E402


def gpu_f32(a):
    """A numpy array (bf16 as raw uint16, or a float type) as an fp32 tensor on the GPU."""
    if a.dtype == np.uint16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).cuda().view(torch.bfloat16).float()
    return torch.from_numpy(np.ascontiguousarray(a)).cuda().float()


def gpu_dequant(w, scales, biases, group=64):
    """MLX affine dequantisation on the GPU (the same arithmetic as hf_golden.dequant: fp32 s * q + b)."""
    s, b = gpu_f32(scales), gpu_f32(biases)
    bits = 32 * w.shape[-1] // (scales.shape[-1] * group)
    assert bits in (2, 4, 8), bits
    wt = torch.from_numpy(np.ascontiguousarray(w).view(np.int32)).cuda()
    shifts = torch.arange(0, 32, bits, device="cuda", dtype=torch.int32)
    q = (wt.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # the mask drops the sign bits of the arithmetic shift
    q = q.reshape(*w.shape[:-1], scales.shape[-1], group).float()
    return (q * s.unsqueeze(-1) + b.unsqueeze(-1)).reshape(*w.shape[:-1], scales.shape[-1] * group)


def hf_tensors(ckpt):
    """Yields (HF name, fp32 tensor on the GPU) for the text model, one tensor at a time (bounded memory)."""
    index = os.path.join(ckpt, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    pending = {}  # switch_mlp halves waiting for their partner, per layer
    for f in files:
        t = read_safetensors(os.path.join(ckpt, f))
        for k in t:
            if not k.startswith("language_model.") or k.endswith(".scales") or k.endswith(".biases"):
                continue
            base = k[: -len(".weight")] if k.endswith(".weight") else k
            v = gpu_dequant(t[k], t[base + ".scales"], t[base + ".biases"]) if base + ".scales" in t else gpu_f32(t[k])
            name = k.replace("language_model.model.", "model.").replace("language_model.lm_head", "lm_head")
            if name.endswith("conv1d.weight"):
                v = v.permute(0, 2, 1)
            if name.endswith(ZERO_CENTRED_NORMS) or name == "model.norm.weight":
                v = v - 1.0
            if ".mlp.switch_mlp." in name:
                layer, part = name.split(".mlp.switch_mlp.")
                if part == "down_proj.weight":
                    yield layer + ".mlp.experts.down_proj", v
                    continue
                p = pending.setdefault(layer, {})
                p[part] = v
                if len(p) == 2:
                    yield layer + ".mlp.experts.gate_up_proj", torch.cat([p["gate_proj.weight"], p["up_proj.weight"]], dim=1)
                    del pending[layer]
                continue
            yield name, v
        del t


def build_hf(ckpt):
    from transformers import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM
    cfg_json = json.load(open(os.path.join(ckpt, "config.json")))
    tc = dict(cfg_json.get("text_config", cfg_json))
    for k in ("quantization", "quantization_config", "model_type", "architectures"):
        tc.pop(k, None)
    cfg = Qwen3_5MoeTextConfig(**tc)
    cfg._attn_implementation = "sdpa"
    impl = os.environ.get("EXPERTS", "grouped_mm")
    cfg._experts_implementation = impl
    # bf16 from the start: an fp32 model of this size would not fit in the GPU's memory.
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        model = Qwen3_5MoeForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model = model.to_empty(device="cuda").eval()
    params = dict(model.named_parameters())
    seen = set()
    with torch.no_grad():
        for name, v in hf_tensors(ckpt):
            if name not in params:
                raise SystemExit(f"unexpected tensor {name}")
            if tuple(params[name].shape) != tuple(v.shape):
                raise SystemExit(f"{name}: checkpoint shape {tuple(v.shape)}, model {tuple(params[name].shape)}")
            params[name].copy_(v.to(params[name].dtype))
            seen.add(name)
    missing = [n for n in params if n not in seen]
    if missing:
        raise SystemExit(f"missing tensors: {missing[:10]}")
    # Non-persistent buffers (rotary inv_freq) were lost by to_empty: recompute them.
    for m in model.modules():
        if hasattr(m, "inv_freq") and hasattr(m, "compute_default_rope_parameters"):
            inv, _ = m.compute_default_rope_parameters(m.config, "cuda")
            m.inv_freq = inv
            m.original_inv_freq = inv.clone()
    try:
        model.set_experts_implementation(impl)
    except Exception:
        pass
    return model, cfg


def hf_run(model, cfg, lengths, steps):
    out = []
    V = min(cfg.vocab_size, 151000)
    with torch.inference_mode():
        for L in lengths:
            try:
                out += hf_one(model, V, L, steps)
            except torch.cuda.OutOfMemoryError:
                print(f"HF: out of memory at length {L}; cell left empty", flush=True)
            torch.cuda.empty_cache()
    return out


def hf_one(model, V, L, steps):
    """Prefill of L random tokens, then `steps` timed greedy decode steps from that cache."""
    out = []
    ids = torch.randint(0, V, (1, L), device="cuda")
    model(ids[:, : min(L, 128)], use_cache=True, logits_to_keep=1)  # warm-up
    torch.cuda.synchronize()
    t = time.perf_counter()
    o = model(ids, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    out.append({"phase": "prefill", "length": L, "tok_s": L / (time.perf_counter() - t)})
    pkv, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
    o = model(nxt, past_key_values=pkv, use_cache=True)  # warm-up step
    pkv, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        o = model(nxt, past_key_values=pkv, use_cache=True)
        pkv, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    out.append({"phase": "decode", "length": L, "tok_s": steps / (time.perf_counter() - t)})
    del pkv, o
    return out


def fern_run(fern, ckpt, lengths, prefill_lengths, steps):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [fern, "bench", "--model", ckpt, "--backend", "cuda", "--phase", "both", "--runs", "1",
               "--steps", str(steps), "--lengths", ",".join(map(str, lengths)),
               "--prefill-lengths", ",".join(map(str, prefill_lengths)), "--json", f.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        res = json.load(open(f.name))
    return [{"phase": r["phase"], "length": r.get("context", r.get("length")), "tok_s": r["tok_s_median"]}
            for r in res["results"]], res.get("commit", "?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fern", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--lengths", default="256,512,1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--prefill-lengths", default=None, help="fern's prefill lengths (default: --lengths)")
    ap.add_argument("--hf-lengths", default="256,512,1024,2048,4096,8192,16384,32768")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--hf-steps", type=int, default=16)
    ap.add_argument("--out", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop before a round that would end past this many seconds from the start (0: no limit)")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    prefill_lengths = [int(x) for x in a.prefill_lengths.split(",")] if a.prefill_lengths else lengths
    hf_lengths = [int(x) for x in a.hf_lengths.split(",")]
    t0 = time.perf_counter()
    model, cfg = build_hf(a.ckpt)
    print(f"HF model built from {a.ckpt} in {time.perf_counter() - t0:.0f} s "
          f"({torch.cuda.memory_allocated() / 1e9:.1f} GB on the GPU)", flush=True)
    runs = {"fern": [], "hf": []}
    commit = "?"

    def write_table():
        """The table so far (medians over the rounds done), written after every round so that a run cut short by a
        time limit still leaves its results."""
        def med(eng, phase, L):
            v = [x["tok_s"] for rr in runs[eng] for x in rr if x["phase"] == phase and x["length"] == L]
            return statistics.median(v) if v else None

        table = {"fern": [], "hf": [], "commit": commit, "gpu": torch.cuda.get_device_name(),
                 "rounds": {eng: len(runs[eng]) for eng in runs},
                 "transformers": __import__("transformers").__version__, "torch": torch.__version__,
                 # Without the fla package HF's Gated DeltaNet runs its PyTorch fallback (slower prefill).
                 "fla": importlib.util.find_spec("fla") is not None}
        md = ["| length | fern decode | HF decode | ratio | fern prefill | HF prefill | ratio |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
        fmt = lambda v: "-" if v is None else f"{v:,.1f}"
        ratio = lambda x, y: "-" if x is None or y is None else f"{x / y:.1f}x"
        for L in lengths:
            fd, hd, fp, hp = med("fern", "decode", L), med("hf", "decode", L), med("fern", "prefill", L), med("hf", "prefill", L)
            for eng, ph, v in (("fern", "decode", fd), ("hf", "decode", hd), ("fern", "prefill", fp), ("hf", "prefill", hp)):
                if v is not None:
                    table[eng].append({"phase": ph, "length": L, "tok_s_median": v})
            md.append(f"| {L} | {fmt(fd)} | {fmt(hd)} | {ratio(fd, hd)} | {fmt(fp)} | {fmt(hp)} | {ratio(fp, hp)} |")
        json.dump(table, open(a.out, "w"), indent=1)
        open(a.md, "w").write("\n".join(md) + "\n")
        return md

    md = []
    round_s = 0.0
    for r in range(a.rounds):
        if a.budget_s > 0 and r > 0 and time.perf_counter() - t0 + round_s > a.budget_s:
            print(f"stopping after {r} rounds: another would pass the {a.budget_s:.0f} s budget", flush=True)
            break
        t_round = time.perf_counter()
        order = ["fern", "hf"] if r % 2 == 0 else ["hf", "fern"]
        for eng in order:
            t = time.perf_counter()
            if eng == "fern":
                res, commit = fern_run(a.fern, a.ckpt, lengths, prefill_lengths, a.steps)
            else:
                res = hf_run(model, cfg, hf_lengths, a.hf_steps)
            runs[eng].append(res)
            print(f"round {r} {eng} ({time.perf_counter() - t:.0f} s): "
                  + ", ".join(f"{x['phase'][0]}{x['length']}={x['tok_s']:.1f}" for x in res), flush=True)
        md = write_table()
        round_s = time.perf_counter() - t_round
    print("\n".join(md))


if __name__ == "__main__":
    main()
