/* jobspec_pb.h - the job spec to and from its protobuf message
 * (trainyard.v1.JobSpec) and the error model to trainyard.v1.Error. The
 * message goes through the same JSON tree as a REST body, so gRPC and REST
 * accept the same specs and give the same errors, field paths included. */
#ifndef TY_API_JOBSPEC_PB_H
#define TY_API_JOBSPEC_PB_H

#include "api/jobspec.h"
#include "api/trainyard.pb-c.h"

/* Applies the fields present in m over the defaults already in s (like
 * jobspec_from_json). target_modules with the single element "all-linear"
 * selects every linear module. Returns 0 or TY_EINVAL with errors in errs. */
int jobspec_from_pb(jobspec_t *s, const Trainyard__V1__JobSpec *m, ty_errlist_t *errs);

/* The normalized spec as a new message with every field present (the
 * caller frees it with trainyard__v1__job_spec__free_unpacked(m, NULL)). */
Trainyard__V1__JobSpec *jobspec_to_pb(const jobspec_t *s);

/* The error model as a new trainyard.v1.Error (free with
 * trainyard__v1__error__free_unpacked(e, NULL)); details may be NULL. */
Trainyard__V1__Error *ty_error_to_pb(int code, const char *message, const ty_errlist_t *details);

#endif
