/* jsonl_rule.c - the job spec's rule data-holds-a-batch for a JSONL file
 * (train_jsonl_check, which tokenizes the examples) installed into
 * api/jobspec.h's hook before main() runs, in every program this object is
 * linked into (trainyardd and trainyard: target ty_jsonl_rule). So a
 * program validates JSONL data fully by what it links, and trainyardd's
 * own sources name nothing of the worker. Not part of ty_worker: the ranks
 * check their data themselves (data_check.h). */
#include "api/jobspec.h"
#include "worker/rank/data_check.h"

__attribute__((constructor)) static void jsonl_rule_install(void) {
  jobspec_jsonl_check = train_jsonl_check;
}
