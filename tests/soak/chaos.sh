#!/usr/bin/env bash
# chaos.sh - the chaos soak of trainyardd: chaos.sh --minutes N --seed S.
# Faults land at random times while jobs are submitted, watched, cancelled
# and deleted; invariants are checked as it runs and at the end (see
# chaos.py). Binaries come from TRAINYARD_BIN_DIR (default: build). A
# violation prints the seed and the event log that led to it; run again
# with the same seed to replay the same choices. Exit status 1 on any.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export TRAINYARD_BIN_DIR=${TRAINYARD_BIN_DIR:-$here/../../build}
# Debian's python3 has python3-grpcio (the gRPC part of the traffic); any
# python3 with requests runs the rest.
py=python3
if /usr/bin/python3 -c 'import grpc, requests' 2>/dev/null; then py=/usr/bin/python3; fi
exec "$py" "$here/chaos.py" "$@"
