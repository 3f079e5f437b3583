#!/usr/bin/env bash
# spec_cli.sh - the real `trainyard validate` binary: the two acceptance
# cases (init_from_scratch + fsdp.memory_efficient_load exits 2 naming both
# fields; flags alone give a valid normalized spec), the API error model of
# --json, syntax errors with line and column, the examples, and api/RULES.md
# in sync with the code.
set -euo pipefail
bin="${TRAINYARD_BIN_DIR:?}/cli/trainyard"
src="${TRAINYARD_SRC_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. init_from_scratch + memory_efficient_load: exit 2, both fields named.
cat > "$tmp/bad.json" <<'JSON'
{ "init_from_scratch": true, "fsdp": { "memory_efficient_load": true },
  "model": { "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 256 } }
JSON
rc=0
"$bin" validate "$tmp/bad.json" >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] || fail "bad spec: exit $rc, want 2"
grep -q '^fsdp.memory_efficient_load: .*init_from_scratch.*drop one of the two' "$tmp/err" ||
  fail "bad spec: error does not name both fields: $(cat "$tmp/err")"
[ "$(wc -l < "$tmp/err")" = 1 ] || fail "bad spec: expected exactly one error"
[ ! -s "$tmp/out" ] || fail "bad spec: printed a spec"

# 2. Flags alone over an existing folder: exit 0 and the normalized spec.
mkdir "$tmp/model"
"$bin" validate --model_path "$tmp/model" --fsdp.memory_efficient_load true \
  --allocation_mode static >"$tmp/out" || fail "flags: exit $?"
python3 - "$tmp/out" "$tmp/model" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["model_path"] == sys.argv[2], s["model_path"]
assert s["fsdp"] == {"memory_efficient_load": True, "bucket_mb": 64}, s["fsdp"]
assert s["allocation_mode"] == "static" and s["world_size"] == 1
assert s["output_dir"] == "runs/job" and s["model"] is None
assert s["train"]["lr"] == 3e-4 and s["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
PY
# The folder must exist (filesystem checks are on by default).
rc=0
"$bin" validate --model_path "$tmp/none" >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && grep -q '^model_path: .*does not exist' "$tmp/err" || fail "missing model_path"

# 3. Flags win over the file; the output parses back to itself.
"$bin" validate "$src/examples/tiny-lora.json" --no-check-paths --world_size 4 \
  --train.lr 0.001 >"$tmp/n1" || fail "example with flags"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["world_size"]==4 and s["train"]["lr"]==0.001 and s["name"]=="tiny-lora"' "$tmp/n1"
"$bin" validate "$tmp/n1" --no-check-paths >"$tmp/n2" || fail "normalized spec does not validate"
cmp -s "$tmp/n1" "$tmp/n2" || fail "normalizing twice changed the spec"
for f in "$src"/examples/*.json; do
  "$bin" validate "$f" --no-check-paths >/dev/null || fail "example $f does not validate"
done

# 4. --json: the API error model, every error at once.
rc=0
"$bin" validate --json --world_size 0 --alloction_mode static >"$tmp/out" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--json: exit $rc"
python3 - "$tmp/out" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert e["code"] == "INVALID_ARGUMENT", e
fields = [d["field"] for d in e["details"]]
assert fields == ["alloction_mode", "model_path", "world_size"], fields
assert "did you mean --allocation_mode?" in e["details"][0]["message"]
PY

# 5. A syntax error names the file, line and column.
printf '{\n  "name": "x",\n  "world_size": 2,\n}\n' > "$tmp/syntax.json"
rc=0
"$bin" validate "$tmp/syntax.json" 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] || fail "syntax: exit $rc"
grep -q "syntax.json: invalid JSON at line 4, column 1" "$tmp/err" || fail "syntax: $(cat "$tmp/err")"

# 6. api/RULES.md is what the code says.
sh "$src/api/gen-rules.sh" "$bin" > "$tmp/RULES.md"
diff -u "$src/api/RULES.md" "$tmp/RULES.md" ||
  fail "api/RULES.md is stale: run sh api/gen-rules.sh build/cli/trainyard > api/RULES.md"

"$bin" validate --help | grep -q 'usage: trainyard validate' || fail "--help"
echo "spec_cli: all checks passed"
