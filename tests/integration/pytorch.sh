#!/usr/bin/env bash
# pytorch.sh - PyTorch checkpoints written by torch.save itself (twins of
# `trainyard mkmodel` checkpoints in float32, bfloat16 and float16, tied and
# untied heads, single, sharded, and one .pt file of views into one storage
# inside a {"state_dict": ...} wrapper): `trainyard convert` gives back every
# tensor bit for bit; both load paths at 1, 2 and 4 ranks give the same
# shards as the safetensors twin (the load report's digest); `trainyard
# eval` gives the same loss. Then hostile and damaged files are refused
# with a clear error and no side effect.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"
py=/usr/bin/python3 # the interpreter with python3-torch
mk="$(dirname "$0")/pt_make.py"

# digests OUT: one line per rank, "rank digest", from `trainyard load`.
digests() {
  python3 -c '
import json, re, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    assert j["status"] == "ok", j
    print(j["rank"], re.search(r"digest ([0-9a-f]{16})", j["message"]).group(1))' "$1"
}

words "$tmp/words.txt" 3000
n=0
for dtype in f32 bf16 f16; do
  for tie in "" --tie-embeddings; do
    n=$((n + 1))
    m="$tmp/m$n"
    "$ty" mkmodel --out "$m" --hidden-size 24 --intermediate-size 50 --layers 2 --heads 3 \
      --kv-heads 1 --vocab-size 300 --dtype $dtype $tie --seed $n >/dev/null
    for mode in single sharded packed; do
      "$py" "$mk" twin "$m" "$tmp/pt$n-$mode" $mode || fail "torch.save of $dtype $tie $mode"
      src="$tmp/pt$n-$mode"
      [ $mode = packed ] && src="$tmp/pt$n-$mode/model.pt"
      # convert: every tensor as in the safetensors twin (sharded output too).
      "$ty" convert --model_path "$src" --out "$tmp/c$n-$mode" --shard_mb 1 >/dev/null \
        || fail "convert $dtype $tie $mode"
      "$py" "$mk" same "$m" "$tmp/c$n-$mode" >/dev/null || fail "converted $dtype $tie $mode differs"
      # Both load paths over the PyTorch files at 1, 2 and 4 ranks hold the
      # safetensors twin's shards.
      for world in 1 2 4; do
        if [ ! -e "$m.dig$world" ]; then
          "$ty" load --model_path "$m" --world_size $world --fsdp.memory_efficient_load true \
            >"$tmp/st.out" 2>/dev/null || fail "load of the safetensors twin"
          digests "$tmp/st.out" >"$m.dig$world"
        fi
        for eff in true false; do
          "$ty" load --model_path "$src" --world_size $world --fsdp.memory_efficient_load $eff \
            --fsdp.bucket_mb 1 >"$tmp/pt.out" 2>"$tmp/pt.err" \
            || { cat "$tmp/pt.out" "$tmp/pt.err"; fail "load $dtype $tie $mode, $world ranks, efficient $eff"; }
          digests "$tmp/pt.out" >"$tmp/pt.dig"
          cmp -s "$m.dig$world" "$tmp/pt.dig" \
            || fail "shards differ: $dtype $tie $mode, $world ranks, efficient $eff"
        done
      done
    done
    # eval: the same loss over the PyTorch file as over the safetensors.
    a=$("$ty" eval --model_path "$m" --data "$tmp/words.txt" --seq_len 16 --batches 4 2>/dev/null)
    b=$("$ty" eval --model_path "$tmp/pt$n-single" --data "$tmp/words.txt" --seq_len 16 \
      --batches 4 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "eval differs ($dtype $tie): '$a' vs '$b'"
  done
done

# zip64: the same file with only its zip64 end records telling where the
# directory is (as torch writes files over 4 GiB) loads the same shards.
mkdir "$tmp/z64"
cp "$tmp/m1/config.json" "$tmp/z64/"
"$py" "$mk" zip64 "$tmp/pt1-single/pytorch_model.bin" "$tmp/z64/pytorch_model.bin"
"$ty" load --model_path "$tmp/z64" --world_size 2 >"$tmp/pt.out" 2>/dev/null || fail "zip64 load"
digests "$tmp/pt.out" >"$tmp/pt.dig"
cmp -s "$tmp/m1.dig2" "$tmp/pt.dig" || fail "zip64 shards differ"

# Pickle protocol 4 (torch.save(..., pickle_protocol=4)): the same shards.
"$py" "$mk" twin "$tmp/m1" "$tmp/p4" proto4
"$ty" load --model_path "$tmp/p4" --world_size 2 >"$tmp/pt.out" 2>/dev/null || fail "protocol 4 load"
digests "$tmp/pt.out" >"$tmp/pt.dig"
cmp -s "$tmp/m1.dig2" "$tmp/pt.dig" || fail "protocol 4 shards differ"

# A config.json that ties the head, over a file whose lm_head holds other
# bytes, is refused naming it.
cp "$tmp/m1/config.json" "$tmp/pt1-single/config.json.orig"
sed 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$tmp/m1/config.json" \
  >"$tmp/pt1-single/config.json"
if "$ty" convert --model_path "$tmp/pt1-single" --out "$tmp/bad-tie" >/dev/null 2>"$tmp/err"; then
  fail "a tied config over an untied head was accepted"
fi
grep -q "lm_head.weight.*tie_word_embeddings" "$tmp/err" || fail "tie message: $(cat "$tmp/err")"

# The legacy format is refused, saying how to re-save it.
"$py" "$mk" twin "$tmp/m1" "$tmp/legacy" legacy
if "$ty" load --model_path "$tmp/legacy/model.pt" --world_size 1 >"$tmp/out" 2>&1; then
  fail "a legacy file was loaded"
fi
grep -q "legacy PyTorch file.*_use_new_zipfile_serialization=True" "$tmp/out" \
  || fail "legacy message: $(cat "$tmp/out")"

# Hostile and damaged files: each refused with the reason, nothing run.
marker="$tmp/pwned"
"$py" "$mk" hostile "$tmp/h" "$marker"
expect() { # FILE REGEX
  cp "$tmp/m1/config.json" "$tmp/h/config.json"
  if "$ty" convert --model_path "$tmp/h/$1" --out "$tmp/h-out-$1" >/dev/null 2>"$tmp/err"; then
    fail "$1 was accepted"
  fi
  grep -Eq "$2" "$tmp/err" || fail "$1: expected /$2/, got: $(cat "$tmp/err")"
  [ ! -e "$marker" ] || fail "$1: its payload ran"
  [ ! -e "$tmp/h-out-$1/model.safetensors" ] || fail "$1: an output was written"
}
expect os_system.pt "global posix.system is refused|global os.system is refused"
expect eval.pt "global builtins.eval is refused"
expect popen.pt "global subprocess.Popen is refused"
expect reduce_storage.pt "REDUCE of torch.FloatStorage .*is refused"
expect reduce_odict_args.pt "REDUCE of collections.OrderedDict .*is refused"
expect truncated.pt "no end-of-central-directory record"
expect tail_cut.pt "no end-of-central-directory record|truncated|damaged"
expect compressed.pt "is compressed \(method 8\)"
expect overlap.pt "entries 'good/data/0' and 'good/data/0' overlap"
expect moved.pt "the local header names another entry"
expect past_end.pt "run past the start of the central directory|overlap"
expect oversized.pt "claims 65534 entries"
expect strided.pt "not contiguous"
expect not_state_dict.pt "entry 'epoch' is a int, not a tensor|entry 'model' is a dict, not a tensor"
expect float64.pt "torch.DoubleStorage is not read"
# A 74 MB float32 model, converted from one pytorch_model.bin into 1 MiB
# bfloat16 shards: the index names every tensor, the values are the
# twin's rounded to bfloat16, and the host never held the model.
"$ty" mkmodel --out "$tmp/mid" --hidden-size 512 --intermediate-size 1024 --layers 4 --heads 8 \
  --kv-heads 8 --vocab-size 8192 --dtype f32 >/dev/null
"$py" "$mk" twin "$tmp/mid" "$tmp/mid-pt" single
# (Under AddressSanitizer, freed blocks are held in quarantine instead of
# reused, which would count each file's buffers anew: none is kept here.)
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:quarantine_size_mb=0"
"$ty" convert --model_path "$tmp/mid-pt" --out "$tmp/mid-bf16" --dtype bf16 --shard_mb 1 \
  >"$tmp/conv.out" || fail "convert of the 74 MB model"
# The same command's peak on the 28 KB model: what the process costs alone.
"$ty" convert --model_path "$tmp/pt2-single" --out "$tmp/tiny-bf16" --dtype bf16 \
  >"$tmp/conv-tiny.out" || fail "convert of the tiny model"
"$ty" convert --model_path "$tmp/mid" --out "$tmp/mid-ref" --dtype bf16 >/dev/null
"$py" "$mk" same "$tmp/mid-ref" "$tmp/mid-bf16" >/dev/null || fail "bf16 conversion differs"
grep -q '"torch_dtype": "bfloat16"' "$tmp/mid-bf16/config.json" || fail "torch_dtype not set"
python3 - "$tmp/mid-bf16" "$tmp/conv.out" "$tmp/conv-tiny.out" <<'EOF2' || fail "sharded output or host peak"
import json, os, re, sys
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
files = set(idx["weight_map"].values())
assert len(files) > 10, files
assert all(os.path.getsize(os.path.join(d, f)) <= (1 << 20) + 4096 or len(
    [k for k, v in idx["weight_map"].items() if v == f]) == 1 for f in files)
line, tiny = open(sys.argv[2]).read(), open(sys.argv[3]).read()
peak = float(re.search(r"host peak ([0-9.]+) MiB", line).group(1))
base = float(re.search(r"host peak ([0-9.]+) MiB", tiny).group(1))
# The model is 72 MiB: only the 4 MiB chunks (source, fp32, converted) were held.
assert peak <= base + 16, (line, tiny)
EOF2
cat "$tmp/conv.out" "$tmp/conv-tiny.out"

# The memory-efficient load of the pytorch_model.bin keeps the bound that
# integration/load holds safetensors to: shard + one bucket + 64 MiB.
"$ty" load --model_path "$tmp/mid-pt" --world_size 2 --fsdp.memory_efficient_load true \
  --fsdp.bucket_mb 1 >"$tmp/mem.out" 2>/dev/null || fail "memory-efficient load of the .bin"
python3 - "$tmp/mem.out" <<'EOF3' || fail "memory bound of the .bin load"
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    bound = j["device_peak_bytes"] + (1 << 20) + (64 << 20)
    assert j["host_peak_bytes"] <= bound, (j["host_peak_bytes"], bound)
EOF3
echo "pytorch: ok"
