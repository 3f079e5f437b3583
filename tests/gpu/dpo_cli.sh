#!/usr/bin/env bash
# dpo_cli.sh - preference tuning (train.objective dpo) on device cuda
# (label gpu): examples/preference.jsonl, tokenized with a character-level
# tokenizer written here (a vocabulary of 256, so that the head is small),
# through the ChatML template, on one GPU against the CPU worker with the
# same spec: float32 weights give the CPU's per-step losses and reward
# accuracies up to summation order (1e-3 relative), under LoRA (the
# reference the same pass with the adapters off, the head's chunks
# weighted by each row's scale in the backward pass) and training every
# weight (the reference scored on the GPU before the first step). Exits 77
# (a ctest skip), saying why, where no GPU is visible.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)

"$ty" mkmodel --out "$tmp/base" --hidden-size 64 --intermediate-size 128 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --seed 7 >/dev/null
python3 - "$tmp/base" <<'PY'
import json, sys
# One token a printable character, and ChatML's markers and EOS.
vocab = {chr(c): c for c in range(32, 127)}
vocab["\n"] = 10
specials = {"<|im_start|>": 200, "<|im_end|>": 201, "</s>": 202}
vocab.update(specials)
added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for t, i in specials.items()]
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
       "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
       "model": {"type": "BPE", "vocab": vocab, "merges": []}}
json.dump(tok, open(sys.argv[1] + "/tokenizer.json", "w"))
json.dump({"eos_token": "</s>"}, open(sys.argv[1] + "/tokenizer_config.json", "w"))
PY

common=(--model_path "$tmp/base" --dtype float32 --data.path "$src/examples/preference.jsonl"
        --data.format jsonl --data.chat_template chatml --data.seq_len 112
        --data.eval_fraction 0.05 --train.objective dpo --dpo.beta 0.2 --train.steps 6
        --train.micro_batch_size 2 --train.grad_accum 2 --train.checkpoint_every 0)
lora=(--use_lora true --lora_rank 8 --lora_alpha 16 --target_modules all-linear --train.lr 5e-3)
full=(--use_lora false --train.lr 2e-3)
run() { # NAME DEVICE ARGS...
  local name=$1 dev=$2
  shift 2
  "$ty" train "${common[@]}" "$@" --device "$dev" --output_dir "$tmp/$name" --json \
    >"$tmp/$name.out" 2>"$tmp/$name.log"
}
rc=0
run lora-gpu cuda "${lora[@]}" || rc=$?
if [ $rc -ne 0 ]; then
  if grep -q 'no CUDA device is visible' "$tmp/lora-gpu.out" "$tmp/lora-gpu.log"; then
    echo "SKIP gpu/dpo: no CUDA device is visible"
    exit 77
  fi
  cat "$tmp/lora-gpu.log" >&2
  fail "LoRA DPO on the GPU failed"
fi
run lora-cpu cpu "${lora[@]}" || { cat "$tmp/lora-cpu.log" >&2; fail "LoRA DPO on the CPU failed"; }
# The output head in chunks of 100 rows on the GPU: the reference's and the
# policy's forwards fused with the head's backward, which the row scales
# then redo chunk by chunk.
TRAINYARD_HEAD_ROWS=100 run lorachunks-gpu cuda "${lora[@]}" ||
  { cat "$tmp/lorachunks-gpu.log" >&2; fail "LoRA DPO on the GPU, head in chunks, failed"; }
run full-gpu cuda "${full[@]}" || { cat "$tmp/full-gpu.log" >&2; fail "full DPO on the GPU failed"; }
run full-cpu cpu "${full[@]}" || { cat "$tmp/full-cpu.log" >&2; fail "full DPO on the CPU failed"; }

python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
def steps(name):
    reps = [json.loads(l) for l in open(f"{tmp}/{name}.out")]
    return [(r["loss"], r["dpo"]["rewards_accuracies"], r["dpo"]["rewards_margins"])
            for r in reps if r["rank"] == 0 and r["phase"] == "training" and r.get("dpo")], reps
for gpu, cpu in (("lora-gpu", "lora-cpu"), ("lorachunks-gpu", "lora-cpu"),
                 ("full-gpu", "full-cpu")):
    g, greps = steps(gpu)
    c, _ = steps(cpu)
    assert len(g) == len(c) == 6, (gpu, len(g), len(c))
    worst = max(abs(a[0] - b[0]) / max(1.0, abs(b[0])) for a, b in zip(g, c))
    margins = max(abs(a[2] - b[2]) for a, b in zip(g, c))
    print(f"# dpo {gpu} vs {cpu}: 6 step losses, worst relative difference {worst:.2e}, "
          f"margins within {margins:.1e} (loss {g[0][0]:.5f} -> {g[-1][0]:.5f}, "
          f"accuracy {g[-1][1]:.2f})")
    assert worst < 1e-3, list(zip(g, c))
    assert margins < 1e-3, list(zip(g, c))
    if gpu == "full-gpu":  # the reference was scored first, on the GPU
        assert any(r["phase"] == "reference" for r in greps), "no phase reference"
PY
echo "dpo_cli: ok"
