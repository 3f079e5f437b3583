#!/usr/bin/env bash
# load.sh - trainyard mkmodel + trainyard load end to end, with real worker
# processes: both paths and from scratch for 1..4 ranks on a tiny model whose
# dimensions do not divide evenly, every rank's figures checked; a damaged
# checkpoint fails naming the tensor; a bad spec fails naming the field.
set -euo pipefail
. "$(dirname "$0")/../testlib.sh"

"$ty" mkmodel --out "$tmp/m" --hidden-size 24 --intermediate-size 50 --layers 2 --heads 3 \
  --kv-heads 1 --vocab-size 37 --dtype bf16 --shards 2 --seed 5 >/dev/null
# A real of config.json reads as written (jansson alone: 9.9999999999999995e-7).
grep -q '"rms_norm_eps": 1e-6,' "$tmp/m/config.json" || fail "config.json: $(grep eps "$tmp/m/config.json")"
total=$(python3 -c "import json;print(json.load(open('$tmp/m/model.safetensors.index.json'))['metadata']['total_size'])")

# check OUT WORLD PATH: one line per rank, all ok, byte counts consistent.
check() {
  python3 - "$1" "$2" "$3" "$total" <<'EOF'
import json, sys
out, world, path, total = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
lines = [json.loads(l) for l in open(out) if l.strip()]
assert len(lines) == world, f"{len(lines)} lines for {world} ranks"
read = 0
for r, j in enumerate(lines):
    assert j["rank"] == r and j["world_size"] == world, j
    assert j["status"] == "ok" and j["path"] == path, j
    assert j["host_peak_bytes"] > 0 and j["device_peak_bytes"] > 0, j
    assert j["bytes_loaded"] == j["bytes_total"], j
    assert j["shard_bytes"] > 0, j
    if path == "memory_efficient":
        assert j["device_peak_bytes"] == j["shard_bytes"], j
    if path == "standard":
        assert j["bytes_loaded"] == total, j
    read += j["bytes_loaded"]
if path == "memory_efficient":
    assert read == total, f"ranks read {read} bytes of {total}"
    shard = [j["device_peak_bytes"] for j in lines]
    assert max(shard) - min(shard) < total, shard
EOF
}

for world in 1 2 3 4; do
  "$ty" load --model_path "$tmp/m" --world_size $world --fsdp.memory_efficient_load true \
    --fsdp.bucket_mb 1 >"$tmp/eff.out" 2>"$tmp/eff.err" || { cat "$tmp/eff.err"; fail "efficient load, $world ranks"; }
  check "$tmp/eff.out" $world memory_efficient || fail "efficient figures, $world ranks"
  "$ty" load --model_path "$tmp/m" --world_size $world --dtype bfloat16 \
    >"$tmp/std.out" 2>"$tmp/std.err" || { cat "$tmp/std.err"; fail "standard load, $world ranks"; }
  check "$tmp/std.out" $world standard || fail "standard figures, $world ranks"
  grep -q "\[rank $((world - 1))/$world\] load" "$tmp/std.err" || fail "no human progress line"
done

# Memory: on a 37 MB bf16 checkpoint (74 MB as float32), 2 ranks. The
# memory-efficient rank's host peak stays within its shard + one bucket +
# 64 MiB; the standard rank's peak holds the checkpoint and the whole model.
"$ty" mkmodel --out "$tmp/mid" --hidden-size 512 --intermediate-size 1024 --layers 4 --heads 8 \
  --kv-heads 8 --vocab-size 8192 --dtype bf16 >/dev/null
for eff in true false; do
  "$ty" load --model_path "$tmp/mid" --world_size 2 --fsdp.memory_efficient_load $eff \
    --fsdp.bucket_mb 1 >"$tmp/mem_$eff.out" 2>/dev/null || fail "load of the 37 MB model ($eff)"
done
python3 - "$tmp/mem_true.out" "$tmp/mem_false.out" <<'EOF2' || fail "memory bounds"
import json, sys
eff = [json.loads(l) for l in open(sys.argv[1])]
std = [json.loads(l) for l in open(sys.argv[2])]
MiB = 1 << 20
for j in eff:
    bound = j["device_peak_bytes"] + 1 * MiB + 64 * MiB
    assert j["host_peak_bytes"] <= bound, (j["host_peak_bytes"], bound)
for j in std:
    whole = j["bytes_total"] * 3  # bf16 checkpoint + the float32 model
    assert j["host_peak_bytes"] >= whole, (j["host_peak_bytes"], whole)
    assert j["device_peak_bytes"] >= j["bytes_total"] * 2, j
assert max(j["host_peak_bytes"] for j in eff) < min(j["host_peak_bytes"] for j in std) / 2
EOF2

# From scratch: a spec file with a model, 3 ranks.
cat >"$tmp/scratch.json" <<EOF
{"init_from_scratch": true, "world_size": 3,
 "model": {"hidden_size": 24, "intermediate_size": 50, "num_hidden_layers": 1,
           "num_attention_heads": 3, "num_key_value_heads": 1, "vocab_size": 37}}
EOF
"$ty" load "$tmp/scratch.json" >"$tmp/s.out" 2>/dev/null || fail "from-scratch load"
[ "$(grep -c '"path":"init_from_scratch","status":"ok"' "$tmp/s.out")" = 3 ] || fail "scratch lines"

# A checkpoint whose config.json disagrees with its tensors fails naming one.
sed -i 's/"intermediate_size": 50/"intermediate_size": 51/' "$tmp/m/config.json"
if "$ty" load --model_path "$tmp/m" --world_size 2 >"$tmp/bad.out" 2>"$tmp/bad.err"; then
  fail "a mis-shaped checkpoint loaded"
fi
grep -q "mlp.gate_proj.weight' has shape \[50, 24\] but config.json implies \[51, 24\]" "$tmp/bad.err" \
  || { cat "$tmp/bad.err"; fail "no tensor name in the failure"; }
[ "$(grep -c '"status":"failed"' "$tmp/bad.out")" = 2 ] || fail "failed ranks not reported"

# An invalid spec never starts a rank: exit status 2, the field named.
set +e
"$ty" load --model_path "$tmp/m" --world_size 0 >/dev/null 2>"$tmp/inv.err"
rc=$?
set -e
[ $rc = 2 ] || fail "invalid spec exit status $rc"
grep -q "world_size" "$tmp/inv.err" || fail "invalid spec message: $(cat "$tmp/inv.err")"
# mkmodel refuses a shape the model cannot have, naming the flag.
set +e
"$ty" mkmodel --out "$tmp/x" --hidden-size 12 --intermediate-size 7 --layers 1 --heads 3 \
  --kv-heads 2 --vocab-size 5 2>"$tmp/mk.err"
rc=$?
set -e
[ $rc = 2 ] && grep -q -- "--kv-heads: must divide" "$tmp/mk.err" || fail "mkmodel bad shape: $rc"
[ ! -e "$tmp/x" ] || fail "mkmodel wrote a directory for a bad shape"
# ...and never writes over a checkpoint: the one there stays whole, and no
# sharded files join a single-file one.
sum=$(cat "$tmp/m"/* | md5sum)
set +e
"$ty" mkmodel --out "$tmp/m" --hidden-size 24 --intermediate-size 50 --layers 2 --heads 3 \
  --kv-heads 1 --vocab-size 300 --shards 2 2>"$tmp/mk.err"
rc=$?
set -e
[ $rc = 1 ] && grep -q -- "--out $tmp/m already holds a checkpoint (" "$tmp/mk.err" ||
  fail "mkmodel over a checkpoint: $rc $(cat "$tmp/mk.err")"
[ "$(cat "$tmp/m"/* | md5sum)" = "$sum" ] || fail "mkmodel changed the checkpoint it refused"
# A load this host can never hold is refused before any rank starts: the
# config.json of a 4.4e12-parameter model says so, in its dtype.
mkdir -p "$tmp/huge"
echo '{"hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 64,
       "num_attention_heads": 512, "vocab_size": 256000}' >"$tmp/huge/config.json"
set +e
"$ty" load --model_path "$tmp/huge" --dtype bfloat16 --fsdp.memory_efficient_load true \
  >"$tmp/huge.out" 2>"$tmp/huge.err"
rc=$?
set -e
[ $rc = 2 ] && grep -q "trainyard load: model_path: the model (4431609397248 parameters) needs at least .* GiB of this host's memory for its weights in bfloat16 over 1 rank, more than the host's .* GiB (MemTotal): use device cuda" "$tmp/huge.err" ||
  fail "a load past the host's memory: $rc $(cat "$tmp/huge.err")"
[ ! -s "$tmp/huge.out" ] || fail "a refused load printed figures: $(cat "$tmp/huge.out")"
echo "load integration: ok"
