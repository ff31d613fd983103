# Reference logits from HF transformers for fern's golden tests (run on the GPU machine, where torch and
# transformers 5.17 exist; the model runs on the CPU in fp32 so no TF32 or kernel choice blurs the result).
#
#   python3 tools/golden/hf_golden.py --ckpt DIR --format hf|mlx4 --out PREFIX [--seed N]
#
# DIR is a checkpoint written by `fern synth` (HF bf16 layout, or MLX 4-bit layout whose weights are dequantized
# here exactly as MODEL.md 3b says and fed to transformers). For each of several prompts of random token ids
# (one longer than 64 tokens, so Gated DeltaNet chunks and the conv state cross boundaries) it records the
# logits of every prompt position (one forward over the prompt) and of 8 greedy decode steps with the cache.
# Writes PREFIX.json (token ids and layout) and PREFIX.f32 (float32 little-endian logits, row after row).
import argparse
import json
import os
import sys

import numpy as np
import torch
from transformers import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

ZERO_CENTRED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")


RAW_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "U32": np.uint32, "I32": np.int32,
              "U8": np.uint8, "I64": np.int64}


def read_safetensors(path):
    # Parsed by hand so that bf16 arrives as raw uint16 (numpy has no bfloat16).
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=RAW_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def read_tensors(ckpt):
    index = os.path.join(ckpt, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(ckpt, f)))
    return out


def bf16_to_f32(a):
    # safetensors.numpy has no bfloat16 dtype; raw bf16 arrives as uint16 or as ml_dtypes.bfloat16.
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def dequant(w, scales, biases, group=64):
    # MLX affine: w uint32 [.., out, in*bits/32] packed LSB first; scales/biases bf16 [.., out, in/group].
    scales = bf16_to_f32(scales)
    biases = bf16_to_f32(biases)
    bits = 32 * w.shape[-1] // (scales.shape[-1] * group)
    assert bits in (2, 3, 4, 5, 6, 8) and 32 % bits == 0, bits
    in_dim = scales.shape[-1] * group
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    q = (w[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(*w.shape[:-1], in_dim).astype(np.float32)
    s = np.repeat(scales, group, axis=-1)
    b = np.repeat(biases, group, axis=-1)
    return (s * q + b).astype(np.float32)  # fp32 multiply and add, as fern's CPU backend does


def hf_state_dict(ckpt, fmt):
    t = read_tensors(ckpt)
    sd = {}
    if fmt == "hf":
        for k, v in t.items():
            if k.startswith("mtp.") or k.startswith("model.visual."):
                continue
            k2 = k.replace("model.language_model.", "model.")
            sd[k2] = torch.from_numpy(bf16_to_f32(v) if v.dtype != np.float32 else v.copy())
        return sd
    # MLX layout -> HF names and conventions.
    for k in list(t.keys()):
        if not k.startswith("language_model."):
            continue
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else k
        v = t[k]
        if base + ".scales" in t:
            v = dequant(v, t[base + ".scales"], t[base + ".biases"])
        else:
            v = bf16_to_f32(v) if v.dtype != np.float32 else v.astype(np.float32)
        name = k.replace("language_model.model.", "model.").replace("language_model.lm_head", "lm_head")
        if name.endswith("conv1d.weight"):
            v = np.transpose(v, (0, 2, 1))  # MLX [C, 4, 1] -> HF [C, 1, 4]
        if name.endswith(ZERO_CENTRED_NORMS) or name == "model.norm.weight":
            v = v - 1.0  # MLX stores 1 + w; HF adds the 1 itself
        sd[name] = v
    out = {}
    experts = {}
    for name, v in sd.items():
        if ".mlp.switch_mlp." in name:
            layer = name.split(".mlp.switch_mlp.")[0]
            experts.setdefault(layer, {})[name.split(".mlp.switch_mlp.")[1]] = v
            continue
        out[name] = torch.from_numpy(np.ascontiguousarray(v))
    for layer, e in experts.items():
        out[layer + ".mlp.experts.gate_up_proj"] = torch.from_numpy(
            np.concatenate([e["gate_proj.weight"], e["up_proj.weight"]], axis=1))
        out[layer + ".mlp.experts.down_proj"] = torch.from_numpy(np.ascontiguousarray(e["down_proj.weight"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--format", choices=["hf", "mlx4"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lengths", default="7,33,100")
    ap.add_argument("--decode-steps", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    cfg_json = json.load(open(os.path.join(a.ckpt, "config.json")))
    tc = dict(cfg_json.get("text_config", cfg_json))
    for k in ("quantization", "quantization_config", "model_type", "architectures"):
        tc.pop(k, None)
    cfg = Qwen3_5MoeTextConfig(**tc)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(cfg).to(torch.float32).eval()
    sd = hf_state_dict(a.ckpt, a.format)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith("inv_freq")]
    if missing or unexpected:
        print("MISSING", missing[:20], "UNEXPECTED", unexpected[:20], file=sys.stderr)
        sys.exit(1)
    try:
        model.set_experts_implementation("eager")
    except Exception:
        pass
    rng = np.random.default_rng(a.seed)
    V = cfg.vocab_size
    cases = []
    rows = []
    with torch.inference_mode():
        for L in [int(x) for x in a.lengths.split(",")]:
            prompt = rng.integers(0, V, size=L).tolist()
            out = model(torch.tensor([prompt]), use_cache=True)
            prompt_logits = out.logits[0].float().numpy()
            pkv = out.past_key_values
            nxt = int(prompt_logits[-1].argmax())
            generated, step_logits = [], []
            for _ in range(a.decode_steps):
                generated.append(nxt)
                o = model(torch.tensor([[nxt]]), past_key_values=pkv, use_cache=True)
                pkv = o.past_key_values
                lg = o.logits[0, -1].float().numpy()
                step_logits.append(lg)
                nxt = int(lg.argmax())
            offset = sum(r.shape[0] for r in rows)
            rows.append(prompt_logits)
            rows.append(np.stack(step_logits))
            cases.append({"prompt": prompt, "generated": generated, "row_offset": offset,
                          "rows": L + a.decode_steps})
            top = prompt_logits.argmax(-1)
            print(f"L={L}: logits std {prompt_logits.std():.3f}, distinct top-1 {len(set(top.tolist()))}/{L}, "
                  f"generated {generated}")
    allrows = np.concatenate(rows).astype("<f4")
    allrows.tofile(a.out + ".f32")
    json.dump({"format": a.format, "vocab_size": V, "transformers": __import__("transformers").__version__,
               "torch": torch.__version__, "dtype": "float32", "cases": cases}, open(a.out + ".json", "w"))
    print("wrote", a.out, allrows.shape)


if __name__ == "__main__":
    main()
