/* jobspec_pb.c - the job spec to and from trainyard.v1.JobSpec, through the
 * JSON tree that jobspec.c already parses and writes; see jobspec_pb.h. */
#include "api/jobspec_pb.h"

#include <stdio.h>
#include <string.h>

#include "api/pbjson.h"

int jobspec_from_pb(jobspec_t *s, const Trainyard__V1__JobSpec *m, ty_errlist_t *errs) {
  size_t before = errs->len;
  json_t *j = pbjson_from_message(&m->base, "", errs);
  /* A repeated field cannot hold the string form: ["all-linear"] stands for it. */
  json_t *t = json_object_get(j, "target_modules");
  if (json_array_size(t) == 1 && json_is_string(json_array_get(t, 0)) &&
      !strcmp(json_string_value(json_array_get(t, 0)), "all-linear"))
    json_object_set_new(j, "target_modules", json_string("all-linear"));
  jobspec_from_json(s, j, errs);
  json_decref(j);
  return errs->len > before ? TY_EINVAL : 0;
}

Trainyard__V1__JobSpec *jobspec_to_pb(const jobspec_t *s) {
  json_t *j = jobspec_to_json(s);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  ProtobufCMessage *m = pbjson_to_message(j, &trainyard__v1__job_spec__descriptor, "", &errs);
  /* jobspec_to_json writes only what the message declares: cannot fail. */
  for (size_t i = 0; i < errs.len; i++)
    fprintf(stderr, "jobspec_to_pb: %s: %s\n", errs.items[i].field, errs.items[i].message);
  ty_errlist_clear(&errs);
  json_decref(j);
  return (Trainyard__V1__JobSpec *)m;
}

Trainyard__V1__Error *ty_error_to_pb(int code, const char *message, const ty_errlist_t *details) {
  json_t *j = ty_error_json(code, message, details);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  ProtobufCMessage *m =
      pbjson_to_message(json_object_get(j, "error"), &trainyard__v1__error__descriptor, "", &errs);
  ty_errlist_clear(&errs);
  json_decref(j);
  return (Trainyard__V1__Error *)m;
}
