#!/bin/sh
# gen-rules.sh - writes api/RULES.md from the tables in the code, through
# `trainyard validate --rules` and `--fields`:
#   sh api/gen-rules.sh build/cli/trainyard > api/RULES.md
# tests/integration/spec_cli.sh checks that the file is in sync.
set -eu
bin=${1:-build/cli/trainyard}
cat <<'HEAD'
# Job spec: rules and fields

Generated from the rule table (api/jobspec_rules.c) and the field table
(api/jobspec.c) by `sh api/gen-rules.sh build/cli/trainyard > api/RULES.md`;
a test fails when this file and the code disagree.

"checked at": `spec` by `jobspec_validate` (every entry point, and
`trainyard validate`), `paths` by the same with filesystem checks on,
`submit` by the server (`jobspec_check_roots`, `jobspec_check_devices`,
the stored jobs for `output-dir-free`), `load` by the worker.

## Rules

HEAD
"$bin" validate --rules
printf '\n## Fields\n\n'
"$bin" validate --fields
