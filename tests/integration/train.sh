#!/usr/bin/env bash
# train.sh - training end to end with real processes: a LoRA job on a
# `trainyard mkmodel` checkpoint and a full job from scratch run through
# trainyard-worker (TRAINYARD_MODE=train), their reports, the PEFT adapter
# and Hugging Face checkpoint they write, `trainyard eval` on both (the
# adapter lowers the loss; evaluation is reproducible) and `trainyard load`
# reading the trained checkpoint back.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

# Text every Debian system has; generated words where it is missing.
data=/usr/share/common-licenses/GPL-3
if [ ! -r "$data" ]; then
  data="$tmp/words.txt"
  words "$data" 8000
fi

"$ty" mkmodel --out "$tmp/base" --hidden-size 64 --intermediate-size 96 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --dtype bf16 --seed 3 >/dev/null

cat >"$tmp/lora.json" <<JSON
{"name": "it-lora", "model_path": "$tmp/base", "use_lora": true, "lora_rank": 8,
 "lora_alpha": 16, "target_modules": "all-linear",
 "data": {"path": "$data", "format": "text", "seq_len": 64},
 "train": {"steps": 30, "micro_batch_size": 4, "lr": 1e-2, "warmup_steps": 3,
           "checkpoint_every": 10},
 "output_dir": "$tmp/out-lora"}
JSON
TRAINYARD_SPEC="$tmp/lora.json" "$worker" >"$tmp/lora.reports" 2>"$tmp/lora.log" ||
  { cat "$tmp/lora.log" >&2; fail "the LoRA job failed"; }
grep -q '^\[rank 0/1\] train step 30/30 loss' "$tmp/lora.log" || fail "no progress line for step 30"

python3 - "$tmp" <<'PY'
import json, struct, sys
tmp = sys.argv[1]
reps = [json.loads(l) for l in open(f"{tmp}/lora.reports")]
phases = [r["phase"] for r in reps]
assert phases[0] == "starting" and phases[-1] == "done", phases
steps = [r for r in reps if r["phase"] == "training" and r["loss"] is not None]
assert [r["step"] for r in steps] == list(range(1, 31)), [r["step"] for r in steps]
for r in reps:
    assert set(r) >= {"job_id", "attempt", "rank", "world_size", "phase", "step", "total_steps",
                      "loss", "tokens_per_s", "host_peak_bytes", "message"}, r
# One rank loads the whole checkpoint and says what it read, as sharded ranks do.
import os
# Its activations for 4 x 64 tokens, counted here from the buffers' shapes
# (every layer's: the residual stream, norms, q/k/v, attention, MLP; the
# head's logits; one layer's gradients; the scores' scratch).
cfg = json.load(open(f"{tmp}/base/config.json"))
C, FF, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
HS, T = C // NH, 64
N = 4 * T
per_layer = 3 * C + 2 + 2 * NH * HS + 2 * NKV * HS + NH + 3 * FF
floats = ((L + 1) * N * C + N * L * per_layer + N * C + 2 * N + N * V + T * HS + T * T
          + 3 * N * C + 2 * N * NH * HS + 2 * N * NKV * HS + 3 * N * FF + 2 * T * T)
mib = (4 * floats + 16 * N) / 1048576
want_msg = f"weights loaded; activations {mib:.1f} MiB a rank"
loaded = [r for r in reps if r["phase"] == "loading" and r["message"] == want_msg]
assert len(loaded) == 1, (want_msg, [r for r in reps if r["phase"] == "loading"])
ld = loaded[0]
header = struct.unpack("<Q", open(f"{tmp}/base/model.safetensors", "rb").read(8))[0]
want = os.path.getsize(f"{tmp}/base/model.safetensors") - 8 - header
assert ld["bytes_loaded"] == ld["bytes_total"] == want, (ld, want)
assert ld["load_seconds"] > 0 and ld["device_peak_bytes"] == 2 * want, ld
# The saving and done reports keep the last step's throughput.
assert reps[-1]["tokens_per_s"] == steps[-1]["tokens_per_s"] > 0, (reps[-1], steps[-1])
saves = [r for r in reps if r["phase"] == "saving"]
assert saves and all(r["tokens_per_s"] > 0 for r in saves), saves
# ...and every later report carries them, so the rank's row keeps them.
after = reps[reps.index(ld):]
assert all(r["bytes_total"] == want and r["load_seconds"] == ld["load_seconds"] for r in after), \
    [(r["phase"], r["bytes_total"]) for r in after]
print("# LoRA job:", reps[-1]["message"], "; first loss %.4f last %.4f" % (steps[0]["loss"], steps[-1]["loss"]))
cfg = json.load(open(f"{tmp}/out-lora/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM", cfg
assert cfg["r"] == 8 and cfg["lora_alpha"] == 16 and cfg["base_model_name_or_path"] == f"{tmp}/base"
assert sorted(cfg["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj",
                                                "gate_proj", "up_proj", "down_proj"])
raw = open(f"{tmp}/out-lora/adapter_model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
a = hdr["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"]
b = hdr["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
assert a["shape"] == [8, 64] and b["shape"] == [32, 8] and a["dtype"] == "F32", (a, b)
assert len([k for k in hdr if k != "__metadata__"]) == 2 * 7 * 2
PY
ls "$tmp/out-lora/checkpoints" | grep -q '^step-00000020$' || fail "no checkpoint of step 20"

# The adapters' checkpoint belongs to its base: a longer run over another
# checkpoint of the same shape is refused, naming both; over a copy of the
# same base (another path) it resumes. The checkpoint is left as it was.
"$ty" mkmodel --out "$tmp/other" --hidden-size 64 --intermediate-size 96 --layers 2 --heads 4 \
  --kv-heads 2 --vocab-size 256 --dtype bf16 --seed 4 >/dev/null
cp -r "$tmp/base" "$tmp/base-copy"
sum=$(cat "$tmp/out-lora/checkpoints/step-00000020"/* | md5sum)
longer=("$ty" train "$tmp/lora.json" --train.steps 40 --output_dir "$tmp/out-lora")
rc=0
"${longer[@]}" --model_path "$tmp/other" >/dev/null 2>"$tmp/other.log" || rc=$?
[ "$rc" = 1 ] || fail "a resume over another base exited $rc"
grep -q "trained its adapters over another base checkpoint ($tmp/base, fingerprint [0-9a-f]*); this run's model_path $tmp/other has fingerprint" \
  "$tmp/other.log" || fail "the refused resume does not say why: $(cat "$tmp/other.log")"
[ "$(cat "$tmp/out-lora/checkpoints/step-00000020"/* | md5sum)" = "$sum" ] ||
  fail "the refused resume changed the checkpoint"
# A save that a killed run left unfinished (step-N.tmp, here with a state
# file in it) is not resumed from, and goes with the next checkpoint.
mkdir "$tmp/out-lora/checkpoints/step-00000025.tmp"
head -c 4096 /dev/urandom >"$tmp/out-lora/checkpoints/step-00000025.tmp/state.safetensors"
"${longer[@]}" --model_path "$tmp/base-copy" >/dev/null 2>"$tmp/copy.log" ||
  fail "the resume over a copy of the base failed: $(cat "$tmp/copy.log")"
grep -q "resumed from the checkpoint of step 20" "$tmp/copy.log" || fail "no resume over the copy"
# (The last step writes the outputs, not a checkpoint: step 30 is newest.)
[ "$(ls "$tmp/out-lora/checkpoints")" = "step-00000030" ] ||
  fail "checkpoints left beside the newest: $(ls "$tmp/out-lora/checkpoints")"

ev=("$ty" eval --model_path "$tmp/base" --data "$data" --seq_len 64 --batches 8)
base=$("${ev[@]}")
with=$("${ev[@]}" --adapter "$tmp/out-lora")
again=$("${ev[@]}" --adapter "$tmp/out-lora")
echo "# eval: base $base, with adapter $with"
[ "$with" = "$again" ] || fail "eval is not reproducible: $with vs $again"
python3 -c "
import json, sys
b, w = json.loads('$base'), json.loads('$with')
assert b['tokens'] == w['tokens'] == 8 * 64, (b, w)
assert w['loss'] < b['loss'] - 0.2, (b, w)"
"$ty" eval --model_path "$tmp/base" --data "$data" --seq_len 64 --batches 100000 2>"$tmp/err" &&
  fail "eval past the end of the data succeeded"
grep -q "tokens" "$tmp/err" || fail "eval past the end: unclear error: $(cat "$tmp/err")"

# Data too short for one global batch fails the rank before it reads a
# weight: the failure follows the start, with no load between.
printf 'far too short' >"$tmp/short.txt"
sed -e "s|\"path\": \"$data\"|\"path\": \"$tmp/short.txt\"|" -e "s|out-lora|out-short|" \
  "$tmp/lora.json" >"$tmp/short.json"
if TRAINYARD_SPEC="$tmp/short.json" "$worker" >"$tmp/short.reports" 2>"$tmp/short.log"; then
  fail "a job with too little data succeeded"
fi
python3 - "$tmp/short.reports" "$tmp/short.txt" <<'PY'
import json, sys
reps = [json.loads(l) for l in open(sys.argv[1])]
assert [r["phase"] for r in reps] == ["starting", "failed"], [(r["phase"], r["message"]) for r in reps]
assert reps[-1]["message"].startswith("data file %s holds 13 tokens" % sys.argv[2]), reps[-1]
PY

# A model this host can never hold is refused before anything is written:
# its config.json alone (4.4e12 parameters) says so.
mkdir -p "$tmp/huge"
echo '{"hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 64,
       "num_attention_heads": 512, "vocab_size": 256000}' >"$tmp/huge/config.json"
rc=0
"$ty" train --model_path "$tmp/huge" --use_lora true --world_size 2 --output_dir "$tmp/out-huge" \
  2>"$tmp/huge.err" || rc=$?
[ "$rc" = 2 ] || fail "a model past the host's memory: exit $rc: $(cat "$tmp/huge.err")"
grep -q "trainyard train: fsdp.memory_efficient_load: is false: on the standard path each of the 2 ranks places the whole model\|trainyard train: model_path: the model (4[0-9]* parameters) needs at least .* GiB of this host's memory for its weights in float32 over 2 ranks and their activations, more than the host's .* GiB (MemTotal)" "$tmp/huge.err" ||
  fail "the refusal does not say why: $(cat "$tmp/huge.err")"
[ ! -e "$tmp/out-huge" ] || fail "a refused job wrote $tmp/out-huge"

# Full training from scratch; the written checkpoint loads and evaluates.
cat >"$tmp/full.json" <<JSON
{"name": "it-full", "init_from_scratch": true,
 "model": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256},
 "data": {"path": "$data", "format": "text", "seq_len": 64},
 "train": {"steps": 30, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 3},
 "output_dir": "$tmp/out-full"}
JSON
TRAINYARD_SPEC="$tmp/full.json" "$worker" >"$tmp/full.reports" 2>"$tmp/full.log" ||
  { cat "$tmp/full.log" >&2; fail "the full job failed"; }
tail -1 "$tmp/full.log"
"$ty" load --model_path "$tmp/out-full" >"$tmp/load.out" || fail "the trained checkpoint does not load"
full=$("$ty" eval --model_path "$tmp/out-full" --data "$data" --seq_len 64 --batches 8)
echo "# eval of the full-trained checkpoint: $full (base $base)"
python3 -c "
import json
f, b = json.loads('$full'), json.loads('$base')
assert f['loss'] < b['loss'] - 1.0, (f, b)"

# The AReaL-style command line exactly as given (no data.path: the built-in
# corpus; output_dir defaults to runs/<name> under the working directory).
(cd "$tmp" && "$ty" train --fsdp.memory_efficient_load true --model_path "$tmp/base" \
  --allocation_mode static >"$tmp/areal.out" 2>"$tmp/areal.log") ||
  { cat "$tmp/areal.log" >&2; fail "the AReaL-style invocation failed"; }
grep -q "built-in corpus" "$tmp/areal.log" || fail "the built-in corpus is not announced"
[ -s "$tmp/runs/job/model.safetensors" ] || fail "no checkpoint written to runs/job"
grep 'done: held-out' "$tmp/areal.log"

# One run at a time in an output folder: a second `train` of the folder
# (however spelled) is refused while the first runs, and leaves its job.json
# alone; once the first has stopped, the folder takes a new run.
"$ty" train --model_path "$tmp/base" --use_lora true --data.path "$data" --data.seq_len 32 \
  --train.steps 1000000 --output_dir "$tmp/out-lock" >/dev/null 2>"$tmp/lock1.log" &
first=$!
for _ in $(seq 200); do grep -q 'train step 1/' "$tmp/lock1.log" && break; sleep 0.05; done
grep -q 'train step 1/' "$tmp/lock1.log" || fail "the long run did not start: $(cat "$tmp/lock1.log")"
rc=0
"$ty" train --model_path "$tmp/base" --use_lora true --data.path "$data" --data.seq_len 32 \
  --train.steps 2 --output_dir "$tmp//out-lock/" >/dev/null 2>"$tmp/lock2.log" || rc=$?
[ "$rc" = 1 ] || fail "a second run of a busy folder exited $rc: $(cat "$tmp/lock2.log")"
grep -q "output_dir: $tmp//out-lock/ is in use by another trainyard run" "$tmp/lock2.log" ||
  fail "the refusal does not say why: $(cat "$tmp/lock2.log")"
grep -q '"steps": 1000000' "$tmp/out-lock/job.json" || fail "the refused run wrote job.json"
kill -INT "$first"
rc=0
wait "$first" || rc=$?
[ "$rc" = 130 ] || fail "the interrupted run exited $rc"
"$ty" train --model_path "$tmp/base" --use_lora true --data.path "$data" --data.seq_len 32 \
  --train.steps 2 --output_dir "$tmp/out-lock" >/dev/null 2>"$tmp/lock3.log" ||
  fail "the folder stayed locked: $(cat "$tmp/lock3.log")"

# A spec that is wrong fails the worker with the field named.
sed 's/"seq_len": 64/"seq_len": 0/' "$tmp/full.json" >"$tmp/bad.json"
TRAINYARD_SPEC="$tmp/bad.json" "$worker" >"$tmp/bad.reports" 2>/dev/null && fail "a bad spec ran"
grep -q '"phase":"failed".*seq_len' "$tmp/bad.reports" || fail "the failure does not name data.seq_len"
# A rank started alone for a spec of several ranks fails saying how to start
# the job, rather than training as a world of one.
python3 -c "
import json
s = json.load(open('$tmp/lora.json')); s['world_size'] = 2
json.dump(s, open('$tmp/w2.json', 'w'))"
TRAINYARD_SPEC="$tmp/w2.json" "$worker" >"$tmp/w2.reports" 2>/dev/null && fail "a lone rank of 2 ran"
grep -q '"phase":"failed".*world_size 2.*one of 1 (TRAINYARD_WORLD_SIZE)' "$tmp/w2.reports" ||
  fail "the lone rank's failure does not say why: $(cat "$tmp/w2.reports")"
# Device cuda: LoRA on GPU ranks, every weight on one GPU or several.
# Never the CPU model under a cuda label: on a host without a GPU (or a
# worker built without CUDA) the job fails and says why; what is not wired
# for GPUs (every weight in bfloat16) fails naming the fix before looking
# for a GPU. tests/gpu/train_cli.sh runs them on a GPU.
cuda_case() { # NAME PYTHON-EDIT WANT-IN-MESSAGE
  python3 -c "
import json
s = json.load(open('$tmp/lora.json')); s['device'] = 'cuda'; s['output_dir'] = '$tmp/out-$1'
$2
json.dump(s, open('$tmp/$1.json', 'w'))"
  TRAINYARD_SPEC="$tmp/$1.json" "$worker" >"$tmp/$1.reports" 2>/dev/null && return 1
  grep -q '"phase":"failed".*device cuda' "$tmp/$1.reports" ||
    fail "$1: the failure does not name the device: $(cat "$tmp/$1.reports")"
  grep -qE "$3" "$tmp/$1.reports" || fail "$1: the failure does not say '$3': $(cat "$tmp/$1.reports")"
  [ ! -e "$tmp/out-$1" ] || fail "$1: a refused cuda job wrote outputs"
}
no_cuda='no CUDA device is visible|built without the CUDA toolkit'
if cuda_case cuda-lora "" "$no_cuda"; then
  echo "device cuda, LoRA: refused on this host (no GPU or no CUDA build)"
else
  echo "device cuda, LoRA: trained on the GPU (tests/gpu/train_cli.sh checks it)"
fi
if cuda_case cuda-full "s['use_lora'] = False; s['dtype'] = 'float32'" "$no_cuda"; then
  echo "device cuda, every weight: refused on this host (no GPU or no CUDA build)"
else
  echo "device cuda, every weight: trained on the GPU (tests/gpu/train_cli.sh checks it)"
fi
cuda_case cuda-full-bf16 "s['use_lora'] = False; s['dtype'] = 'bfloat16'" \
  "keeps float32 weights on the GPU; set dtype float32|built without the CUDA toolkit" ||
  fail "cuda-full-bf16 ran"
# Several GPU ranks through the launcher (NCCL's rendezvous), adapters and
# every weight: refused here with the same reason; on GPUs
# tests/gpu/train_cli.sh trains them. A crashed run's NCCL id is removed
# before the ranks start.
for what in lora full; do
  out="$tmp/out-cuda-$what-w2"
  mkdir -p "$out" && echo stale >"$out/nccl.id"
  if "$ty" train --model_path "$tmp/base" --use_lora "$([ $what = lora ] && echo true || echo false)" \
    --dtype float32 --device cuda --world_size 2 --data.seq_len 32 --train.steps 2 \
    --output_dir "$out" >"$tmp/cuda-$what-w2.log" 2>&1; then
    echo "device cuda, $what, 2 ranks: trained on GPUs"
  else
    grep -qE "rank [01] failed: device cuda: .*($no_cuda|world_size 2 needs NCCL)" \
      "$tmp/cuda-$what-w2.log" ||
      fail "2 cuda ranks ($what): the failure does not say why: $(cat "$tmp/cuda-$what-w2.log")"
    [ ! -e "$out/nccl.id" ] || fail "2 cuda ranks ($what): a stale NCCL id file was left behind"
    echo "device cuda, $what, 2 ranks: refused on this host (no GPU or no CUDA build)"
  fi
done
# Outputs are written aside and renamed when whole: none is left part-way.
left=$(find "$tmp" -name '*.partial')
[ -z "$left" ] || fail "partial files left behind: $left"
echo "ok"
