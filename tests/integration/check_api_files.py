#!/usr/bin/env python3
"""check_api_files.py OPENAPI PROTO [SERVER_ROUTES_C] - the API description files agree with
each other and with DESIGN.md: the OpenAPI document parses as YAML, every
$ref resolves, every REST endpoint of DESIGN.md is there, each schema that
mirrors a protobuf message has exactly that message's fields, the job states
match, the service has its seven RPCs (WatchJob server-streaming), and, when
the server's route table is given, the document has exactly its routes."""
import re
import sys

import yaml  # Debian: python3-yaml (deploy/install-deps.sh test)

openapi_path, proto_path = sys.argv[1], sys.argv[2]
doc = yaml.safe_load(open(openapi_path))
proto = open(proto_path).read()
problems = []

assert doc["openapi"].startswith("3."), doc["openapi"]

# Every endpoint of DESIGN.md "APIs", with its method.
want = {
    ("/v1/jobs", "post"), ("/v1/jobs", "get"), ("/v1/jobs:validate", "post"),
    ("/v1/jobs/{id}", "get"), ("/v1/jobs/{id}", "delete"), ("/v1/jobs/{id}:cancel", "post"),
    ("/v1/jobs/{id}/ranks", "get"), ("/v1/jobs/{id}/metrics", "get"),
    ("/v1/jobs/{id}/events", "get"), ("/v1/jobs/{id}/ranks/{rank}/log", "get"),
    ("/healthz", "get"), ("/metrics", "get"), ("/", "get"),
    ("/v1/internal/jobs/{id}/report", "post"),
}
have = {(p, m) for p, ops in doc["paths"].items() for m in ops}
for p, m in sorted(want - have):
    problems.append(f"openapi: missing {m.upper()} {p}")
submit = doc["paths"]["/v1/jobs"]["post"]
params = [p.get("$ref", p.get("name")) for p in submit.get("parameters", [])]
if "#/components/parameters/IdempotencyKey" not in params:
    problems.append("openapi: POST /v1/jobs has no Idempotency-Key")
events = doc["paths"]["/v1/jobs/{id}/events"]["get"]
if "text/event-stream" not in events["responses"]["200"]["content"]:
    problems.append("openapi: events is not text/event-stream")
if not any(p.get("name") == "Last-Event-ID" for p in events["parameters"]):
    problems.append("openapi: events has no Last-Event-ID")
if "bearer" not in doc["components"]["securitySchemes"]:
    problems.append("openapi: no bearer auth")


def refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


for r in refs(doc):
    node = doc
    for part in r.lstrip("#/").split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        problems.append(f"openapi: unresolved $ref {r}")


def proto_fields(message):
    m = re.search(r"^message %s \{(.*?)^\}" % message, proto, re.S | re.M)
    if not m:
        problems.append(f"proto: no message {message}")
        return set()
    return set(re.findall(r"^\s*(?:optional|repeated|required)\s+\S+\s+(\w+)\s*=", m.group(1), re.M))


schemas = doc["components"]["schemas"]
for name in ["JobSpec", "LlamaConfig", "FsdpConfig", "DataConfig", "TrainConfig", "Job",
             "Attempt", "RankProgress", "JobEvent", "EventData", "FieldError"]:
    a, b = set(schemas[name]["properties"]), proto_fields(name)
    if a != b:
        problems.append(f"{name}: openapi only {sorted(a - b)}, proto only {sorted(b - a)}")
if set(schemas["JobList"]["properties"]) != proto_fields("ListJobsResponse"):
    problems.append("JobList differs from ListJobsResponse")
if set(schemas["ValidateResult"]["properties"]) != proto_fields("ValidateJobResponse"):
    problems.append("ValidateResult differs from ValidateJobResponse")

states = re.findall(r"JOB_STATE_(\w+) = [1-9]", proto)
if [s.lower() for s in states] != schemas["JobState"]["enum"]:
    problems.append(f"job states differ: {states} vs {schemas['JobState']['enum']}")
phases = re.findall(r"PHASE_(\w+) = [1-9]", proto)
if [s.lower() for s in phases] != schemas["Phase"]["enum"]:
    problems.append(f"phases differ: {phases} vs {schemas['Phase']['enum']}")

if not re.search(r"^package trainyard\.v1;", proto, re.M):
    problems.append("proto: package is not trainyard.v1")
for rpc in ["SubmitJob", "ValidateJob", "GetJob", "ListJobs", "CancelJob", "DeleteJob"]:
    if not re.search(r"rpc %s\(\w+\) returns \(\w+\);" % rpc, proto):
        problems.append(f"proto: no unary rpc {rpc}")
if not re.search(r"rpc WatchJob\(WatchJobRequest\) returns \(stream \w+\);", proto):
    problems.append("proto: WatchJob is not server-streaming")
if proto_fields("WatchJobRequest") != {"job_id", "after_seq"}:
    problems.append("proto: WatchJobRequest must have job_id and after_seq")

if len(sys.argv) > 3:
    import os
    if os.path.exists(sys.argv[3]):
        routes = set(re.findall(r'\{"(GET|POST|PUT|DELETE|PATCH)", "([^"]+)"', open(sys.argv[3]).read()))
        routes = {(p, m.lower()) for m, p in routes}
        for p, m in sorted(routes - have):
            problems.append(f"server route {m.upper()} {p} is not in openapi.yaml")
        for p, m in sorted(have - routes):
            problems.append(f"openapi.yaml has {m.upper()} {p}, which the server does not route")

for p in problems:
    print("FAIL:", p)
if problems:
    sys.exit(1)
print(f"api files: {len(have)} operations, {len(schemas)} schemas, proto in agreement")
