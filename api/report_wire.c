/* report_wire.c - the report's phase and field tables, its one writer and
 * its one parser; see report_wire.h. */
#include "api/report_wire.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const g_phases[REPORT_PHASE_COUNT] = {
#define REPORT_PHASE_NAME(id, name) [REPORT_PHASE_##id] = name,
    REPORT_PHASES(REPORT_PHASE_NAME)
#undef REPORT_PHASE_NAME
};

const char *report_phase_name(report_phase_t p) {
  return p >= 0 && p < REPORT_PHASE_COUNT ? g_phases[p] : "?";
}

bool report_phase_parse(const char *s, report_phase_t *out) {
  for (int i = 0; s && i < REPORT_PHASE_COUNT; i++)
    if (!strcmp(s, g_phases[i])) {
      *out = (report_phase_t)i;
      return true;
    }
  return false;
}

void report_wire_init(report_wire_t *r) {
  memset(r, 0, sizeof *r);
  r->phase = REPORT_PHASE_STARTING;
  r->loss = NAN;
  for (int i = 0; i < REPORT_DPO_N; i++) r->dpo[i] = NAN;
}

const char *const report_dpo_names[REPORT_DPO_N] = {
#define REPORT_DPO_NAME(name, trl) #name,
    REPORT_DPO_METRICS(REPORT_DPO_NAME)
#undef REPORT_DPO_NAME
};

json_t *report_dpo_json(const double *m) {
  json_t *o = NULL;
  for (int i = 0; i < REPORT_DPO_N; i++) {
    if (!isfinite(m[i])) continue;
    if (!o) o = json_object();
    json_object_set_new(o, report_dpo_names[i], json_real(m[i]));
  }
  return o;
}

void report_dpo_parse(const json_t *o, double *m, ty_errlist_t *errs) {
  for (int i = 0; i < REPORT_DPO_N; i++) m[i] = NAN;
  if (!o || json_is_null(o)) return;
  if (!json_is_object(o)) {
    ty_errlist_add(errs, "dpo", "must be an object of the step's DPO metrics, or null");
    return;
  }
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    int i = 0;
    while (i < REPORT_DPO_N && strcmp(key, report_dpo_names[i])) i++;
    char field[64];
    snprintf(field, sizeof field, "dpo.%s", key);
    if (i == REPORT_DPO_N)
      ty_errlist_add(errs, field,
                     "unknown; the DPO metrics are rewards_chosen, "
                     "rewards_rejected, rewards_accuracies, rewards_margins, "
                     "logps_chosen and logps_rejected");
    else if (!json_is_null(v) && !json_is_number(v))
      ty_errlist_add(errs, field, "must be a number or null");
    else if (json_is_number(v))
      m[i] = json_number_value(v);
  }
}

/* The writers of each kind; a REAL that is not finite is unknown: loss is
 * sent as null, a rate or a duration as 0. */
static json_t *put_STR(const char *v, const char *name) {
  (void)name;
  return json_string(v);
}
static json_t *put_SMALL(int v, const char *name) {
  (void)name;
  return json_integer(v);
}
static json_t *put_COUNT(int64_t v, const char *name) {
  (void)name;
  return json_integer((json_int_t)v);
}
static json_t *put_REAL(double v, const char *name) {
  if (isfinite(v)) return json_real(v);
  return strcmp(name, "loss") ? json_real(0.0) : json_null();
}
static json_t *put_PHASE(report_phase_t v, const char *name) {
  (void)name;
  return json_string(report_phase_name(v));
}
static json_t *put_DPO(const double *v, const char *name) {
  (void)name;
  json_t *o = report_dpo_json(v);
  return o ? o : json_null();
}

json_t *report_wire_json(const report_wire_t *r) {
  json_t *o = json_object();
  if (!o) return NULL;
  int bad = 0;
#define REPORT_PUT(name, kind, member, required, meaning) \
  bad |= json_object_set_new(o, name, put_##kind(r->member, name));
  REPORT_FIELDS(REPORT_PUT)
#undef REPORT_PUT
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* The readers of each kind: v is the field's value (NULL when missing). */
static void get_STR(const json_t *v, char *dst, size_t n, const char *name, bool required,
                    ty_errlist_t *errs) {
  (void)name, (void)required, (void)errs; /* a string field is informational */
  if (json_is_string(v)) snprintf(dst, n, "%s", json_string_value(v));
}

static void get_SMALL(const json_t *v, int *dst, const char *name, bool required,
                      ty_errlist_t *errs) {
  if (!required && (!v || json_is_null(v))) return;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
    ty_errlist_add(errs, name, "required, a non-negative integer");
  else
    *dst = (int)json_integer_value(v);
}

static void get_COUNT(const json_t *v, int64_t *dst, const char *name, bool required,
                      ty_errlist_t *errs) {
  if (!required && (!v || json_is_null(v))) return;
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    ty_errlist_add(errs, name, "must be a non-negative integer");
  else
    *dst = json_integer_value(v);
}

static void get_REAL(const json_t *v, double *dst, const char *name, bool required,
                     ty_errlist_t *errs) {
  if (!required && (!v || json_is_null(v))) return;
  if (!json_is_number(v))
    ty_errlist_add(errs, name, "must be a number or null");
  else
    *dst = json_number_value(v);
}

static void get_PHASE(const json_t *v, report_phase_t *dst, const char *name, bool required,
                      ty_errlist_t *errs) {
  (void)required; /* always */
  if (!report_phase_parse(json_string_value(v), dst))
    ty_errlist_add(errs, name,
                   "required, one of starting, tokenizing, loading, reference, training, saving, "
                   "done, failed");
}

int report_wire_parse(const json_t *o, report_wire_t *r, ty_errlist_t *errs) {
  report_wire_init(r);
  if (!json_is_object(o)) {
    ty_errlist_add(errs, "", "a report is one JSON object (DESIGN.md \"Worker contract\")");
    return TY_EINVAL;
  }
  size_t before = errs->len;
#define REPORT_GET_STR(name, member, required) \
  get_STR(json_object_get(o, name), r->member, sizeof r->member, name, required, errs);
#define REPORT_GET_SMALL(name, member, required) \
  get_SMALL(json_object_get(o, name), &r->member, name, required, errs);
#define REPORT_GET_COUNT(name, member, required) \
  get_COUNT(json_object_get(o, name), &r->member, name, required, errs);
#define REPORT_GET_REAL(name, member, required) \
  get_REAL(json_object_get(o, name), &r->member, name, required, errs);
#define REPORT_GET_PHASE(name, member, required) \
  get_PHASE(json_object_get(o, name), &r->member, name, required, errs);
#define REPORT_GET_DPO(name, member, required) \
  report_dpo_parse(json_object_get(o, name), r->member, errs);
#define REPORT_GET(name, kind, member, required, meaning) REPORT_GET_##kind(name, member, required)
  REPORT_FIELDS(REPORT_GET)
#undef REPORT_GET
#undef REPORT_GET_STR
#undef REPORT_GET_SMALL
#undef REPORT_GET_COUNT
#undef REPORT_GET_REAL
#undef REPORT_GET_PHASE
#undef REPORT_GET_DPO
  return errs->len > before ? TY_EINVAL : 0;
}

bool report_wire_parse_line(const char *line, report_wire_t *r) {
  if (line[0] != '{') return false;
  json_t *o = json_loads(line, 0, NULL);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  bool ok = json_is_object(o) && report_wire_parse(o, r, &errs) == 0;
  ty_errlist_clear(&errs);
  json_decref(o);
  return ok;
}

bool report_wire_progressed(const report_wire_t *a, const report_wire_t *b) {
  return a->phase != b->phase || a->step != b->step || a->bytes_loaded != b->bytes_loaded;
}
