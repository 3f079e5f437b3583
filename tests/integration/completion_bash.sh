#!/usr/bin/env bash
# completion_bash.sh - `trainyard completion bash` in a real bash: the
# script's own _trainyard function, driven through COMP_WORDS/COMP_CWORD
# as readline drives it, completes commands, flags, the job spec's dotted
# fields and their values, help topics and job ids (from a stand-in for
# `trainyard list`, and nothing, quickly, from a server that is not
# there); `trainyard help` and every `--help` name a docs page that exists.
set -euo pipefail
bin="${TRAINYARD_BIN_DIR:?}/cli/trainyard"
src="${TRAINYARD_SRC_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin" completion bash > "$tmp/trainyard.bash"
# shellcheck disable=SC1091
source "$tmp/trainyard.bash"
complete -p trainyard | grep -q -- '-F _trainyard' || fail "no 'complete -F _trainyard trainyard'"

# The words _trainyard offers for a command line whose last word is being
# completed, one a line, sorted.
comp() {
  COMP_WORDS=("$@")
  COMP_CWORD=$(($# - 1))
  COMP_LINE="$*"
  COMP_POINT=${#COMP_LINE}
  COMPREPLY=()
  _trainyard
  if ((${#COMPREPLY[@]})); then printf '%s\n' "${COMPREPLY[@]}" | sort; fi
}
want() { # want WORDS... -- COMMAND LINE: exactly these words are offered
  local w=() got
  while [[ $1 != -- ]]; do w+=("$1"); shift; done
  shift
  got=$(comp "$@")
  [[ $got == "$(printf '%s\n' "${w[@]}" | sort)" ]] ||
    fail "'$*' completes to [$(echo $got)], want [${w[*]}]"
}
has() { # has WORD -- COMMAND LINE: WORD is among the words offered
  local w=$1 got
  shift 2
  got=$(comp "$@")
  grep -qx -- "$w" <<< "$got" || fail "'$*' does not offer $w: [$(echo $got)]"
}

# 1. Commands, and the help topics beside them.
want submit -- trainyard sub
want train tokenize -- trainyard t
has completion -- trainyard ''
want train training -- trainyard help trai
want bash zsh -- trainyard completion ''

# 2. A command's flags, as its --help names them.
want --state -- trainyard list --st
want --idempotency-key -- trainyard submit --idem
want --follow -- trainyard logs --fo
want --quantize -- trainyard convert --qu
want nf4 fp4 -- trainyard convert --quantize ''

# 3. The spec's fields as dotted flags, on the commands that take a spec
# (and only there), and their values.
want --fsdp.memory_efficient_load -- trainyard validate --fsdp.mem
want --gradient_checkpointing -- trainyard train --gradient
has --train.lr -- trainyard submit --train.
has --data.kind -- trainyard load --data.
want -- trainyard convert --train.
want true false -- trainyard train --use_lora ''
has messages -- trainyard submit --data.kind ''
want float32 bfloat16 float16 -- trainyard validate --dtype ''
want f32 bf16 f16 -- trainyard mkmodel --dtype ''
# A flag that takes a path: nothing offered, readline completes file names.
want -- trainyard train --model_path ''
grep -qw -- '--world_size' <<< "$(comp trainyard train --)" || fail "'train --' lacks --world_size"
[[ $(comp trainyard train -- | grep -c -- '^--model_path$') == 1 ]] ||
  fail "'train --' offers --model_path more than once"

# 4. Job ids, from what `trainyard list` prints (a stand-in here, given the
# flags of the line), and nothing when the server is not there.
cat > "$tmp/trainyard" <<'SH'
#!/bin/sh
[ "$1 $2 $3 $4 $5" = "list --limit 200 --server http://ty.example:8080" ] || exit 1
printf '%s\n' 'ID                   NAME                     STATE' \
  'j-20250101-0001      first                    running' \
  'j-20250101-0002      second                   succeeded'
SH
chmod +x "$tmp/trainyard"
want j-20250101-0001 j-20250101-0002 -- "$tmp/trainyard" get --server http://ty.example:8080 ''
want j-20250101-0002 -- "$tmp/trainyard" cancel --server http://ty.example:8080 j-20250101-0002
want -- "$tmp/trainyard" cancel --reason ''
start=$SECONDS
want -- "$bin" watch --server http://127.0.0.1:9 ''
((SECONDS - start <= 3)) || fail "job ids from a server that is not there took $((SECONDS - start)) s"

# 5. The script refuses other shells by name; the zsh one parses.
rc=0
"$bin" completion fish > /dev/null 2> "$tmp/err" || rc=$?
[[ $rc == 2 ]] && grep -q "no script for the shell 'fish'" "$tmp/err" ||
  fail "completion fish: exit $rc, $(cat "$tmp/err")"
"$bin" completion zsh > "$tmp/_trainyard"
head -1 "$tmp/_trainyard" | grep -qx '#compdef trainyard' || fail "the zsh script lacks #compdef"
if command -v zsh > /dev/null; then
  zsh -n "$tmp/_trainyard" || fail "the zsh script does not parse"
else
  echo "zsh is not installed: the zsh script's syntax is not checked"
fi

# 6. Docs pages: every command's --help and every help topic names one
# that exists.
for cmd in $_trainyard_commands; do
  [[ $cmd == help ]] && continue
  line=$("$bin" "$cmd" --help | tail -1)
  [[ $line =~ ^See\ (docs/[a-z-]+\.md) ]] || fail "'trainyard $cmd --help' ends '$line', not a docs page"
  [[ -f $src/${BASH_REMATCH[1]} ]] || fail "'trainyard $cmd --help' names ${BASH_REMATCH[1]}, not there"
done
for topic in $_trainyard_topics; do
  "$bin" help "$topic" | grep -qx "See docs/$topic.md." || fail "'trainyard help $topic' names no page"
  [[ -f $src/docs/$topic.md ]] || fail "help topic $topic: docs/$topic.md is not there"
done
"$bin" help training | grep -q 'Commands: trainyard merge, trainyard train, trainyard eval' ||
  fail "'trainyard help training' does not list its commands: $("$bin" help training)"
"$bin" help train | grep -q '^usage: trainyard train' || fail "'trainyard help train' is not train's usage"
rc=0
"$bin" help nonsense > /dev/null 2> "$tmp/err" || rc=$?
[[ $rc == 2 ]] && grep -q "'nonsense' is neither a command nor a topic" "$tmp/err" ||
  fail "help nonsense: exit $rc, $(cat "$tmp/err")"
echo "completion_bash: ok"
