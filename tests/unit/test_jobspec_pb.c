/* test_jobspec_pb.c - the protobuf side of the job spec: a message and the
 * equivalent JSON give the same struct; a spec survives the wire (pack,
 * unpack); errors match the JSON ones; the generic JSON mapping of Job,
 * enums and the error model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/jobspec_pb.h"
#include "api/pbjson.h"
#include "jobspec_testutil.h"

static void test_pb_and_json_give_same_struct(void **state) {
  (void)state;
  Trainyard__V1__JobSpec m = TRAINYARD__V1__JOB_SPEC__INIT;
  Trainyard__V1__FsdpConfig fsdp = TRAINYARD__V1__FSDP_CONFIG__INIT;
  Trainyard__V1__TrainConfig train = TRAINYARD__V1__TRAIN_CONFIG__INIT;
  Trainyard__V1__DataConfig data = TRAINYARD__V1__DATA_CONFIG__INIT;
  char *targets[] = {"q_proj", "up_proj"};
  m.name = "pb-job";
  m.model_path = "models/tiny";
  m.dtype = "bfloat16";
  m.device = "cpu";
  m.allocation_mode = "fsdp:d2";
  m.has_use_lora = 1;
  m.use_lora = 1;
  m.has_lora_rank = 1;
  m.lora_rank = 16;
  m.has_lora_alpha = 1;
  m.lora_alpha = 32;
  m.n_target_modules = 2;
  m.target_modules = targets;
  fsdp.has_memory_efficient_load = 1;
  fsdp.memory_efficient_load = 1;
  m.fsdp = &fsdp;
  train.has_lr = 1;
  train.lr = 5e-4;
  train.has_seed = 1;
  train.seed = 7;
  train.has_steps = 1;
  train.steps = 30;
  m.train = &train;
  data.path = "d.txt";
  data.has_seq_len = 1;
  data.seq_len = 32;
  m.data = &data;
  const char *json =
      "{\"name\": \"pb-job\", \"model_path\": \"models/tiny\", \"dtype\": \"bfloat16\", "
      "\"device\": \"cpu\", \"allocation_mode\": \"fsdp:d2\", \"use_lora\": true, \"lora_rank\": "
      "16, \"lora_alpha\": 32, \"target_modules\": [\"q_proj\", \"up_proj\"], \"fsdp\": "
      "{\"memory_efficient_load\": true}, \"train\": {\"lr\": 5e-4, \"seed\": 7, \"steps\": 30}, "
      "\"data\": {\"path\": \"d.txt\", \"seq_len\": 32}}";
  jobspec_t a, b;
  ty_errlist_t e = TY_ERRLIST_INIT;
  jobspec_init(&a);
  assert_int_equal(jobspec_from_pb(&a, &m, &e), 0);
  assert_int_equal(jobspec_validate(&a, false, &e), 0);
  assert_int_equal(tu_check(&b, json, &e), 0);
  assert_memory_equal(&a, &b, sizeof a);
  assert_int_equal(a.world_size, 2);
  assert_int_equal(a.fsdp.bucket_mb, 64); /* unset in the message: the default */
  /* Unset fields keep defaults exactly as absent JSON keys do. */
  Trainyard__V1__JobSpec empty = TRAINYARD__V1__JOB_SPEC__INIT;
  jobspec_t d1, d2;
  jobspec_init(&d1);
  assert_int_equal(jobspec_from_pb(&d1, &empty, &e), 0);
  jobspec_init(&d2);
  assert_memory_equal(&d1, &d2, sizeof d1);
  ty_errlist_clear(&e);
}

static void test_wire_round_trip(void **state) {
  (void)state;
  jobspec_t a, b;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&a,
                            "{\"name\": \"s\", \"init_from_scratch\": true, \"model\": "
                            "{\"hidden_size\": 64, \"intermediate_size\": 128, "
                            "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                            "\"num_key_value_heads\": 2, \"vocab_size\": 256, "
                            "\"tie_word_embeddings\": true}, \"target_modules\": \"all-linear\","
                            " \"train\": {\"seed\": 9223372036854775807, \"lr\": 0.1}}",
                            &e),
                   0);
  Trainyard__V1__JobSpec *m = jobspec_to_pb(&a);
  assert_non_null(m);
  assert_non_null(m->model);
  assert_true(m->model->has_hidden_size);
  assert_int_equal(m->n_target_modules, JOBSPEC_TARGET_COUNT);
  size_t n = trainyard__v1__job_spec__get_packed_size(m);
  uint8_t *buf = malloc(n);
  assert_int_equal(trainyard__v1__job_spec__pack(m, buf), n);
  Trainyard__V1__JobSpec *u = trainyard__v1__job_spec__unpack(NULL, n, buf);
  assert_non_null(u);
  jobspec_init(&b);
  assert_int_equal(jobspec_from_pb(&b, u, &e), 0);
  assert_int_equal(jobspec_validate(&b, false, &e), 0);
  assert_memory_equal(&a, &b, sizeof a);
  assert_true(jobspec_equal(&a, &b));
  trainyard__v1__job_spec__free_unpacked(u, NULL);
  trainyard__v1__job_spec__free_unpacked(m, NULL);
  free(buf);
  /* ["all-linear"] in a message is the string form. */
  Trainyard__V1__JobSpec al = TRAINYARD__V1__JOB_SPEC__INIT;
  char *one[] = {"all-linear"};
  al.n_target_modules = 1;
  al.target_modules = one;
  jobspec_init(&b);
  assert_int_equal(jobspec_from_pb(&b, &al, &e), 0);
  assert_int_equal(b.target_modules, JOBSPEC_TARGET_ALL_LINEAR);
  ty_errlist_clear(&e);
}

static void test_pb_errors_match_json(void **state) {
  (void)state;
  Trainyard__V1__JobSpec m = TRAINYARD__V1__JOB_SPEC__INIT;
  Trainyard__V1__TrainConfig train = TRAINYARD__V1__TRAIN_CONFIG__INIT;
  Trainyard__V1__LlamaConfig model = TRAINYARD__V1__LLAMA_CONFIG__INIT;
  char *targets[] = {"q_projj"};
  m.dtype = "int8";
  m.device = "gpu";
  m.n_target_modules = 1;
  m.target_modules = targets;
  train.has_lr = 1;
  train.lr = NAN;
  train.has_seed = 1;
  train.seed = UINT64_MAX;
  m.train = &train;
  model.has_hidden_size = 1;
  model.hidden_size = 0;
  model.model_type = "gpt2";
  m.model = &model;
  jobspec_t s;
  ty_errlist_t e = TY_ERRLIST_INIT;
  jobspec_init(&s);
  assert_int_equal(jobspec_from_pb(&s, &m, &e), TY_EINVAL);
  assert_true(tu_has(&e, "dtype", "must be \"float32\", \"bfloat16\" or \"float16\", got int8"));
  assert_true(tu_has(&e, "device", "did you mean \"cpu\""));
  assert_true(tu_has(&e, "target_modules[0]", "did you mean \"q_proj\""));
  assert_true(tu_has(&e, "train.lr", "must be a finite number"));
  assert_true(tu_has(&e, "train.seed", "out of range"));
  assert_true(tu_has(&e, "model.hidden_size", "between 1 and"));
  assert_true(tu_has(&e, "model.model_type", "only \"llama\""));
  assert_int_equal(e.len, 7);
  ty_errlist_clear(&e);
  /* Rules see the same struct: the scratch + memory-efficient-load error. */
  Trainyard__V1__JobSpec r = TRAINYARD__V1__JOB_SPEC__INIT;
  Trainyard__V1__FsdpConfig fsdp = TRAINYARD__V1__FSDP_CONFIG__INIT;
  fsdp.has_memory_efficient_load = 1;
  fsdp.memory_efficient_load = 1;
  r.fsdp = &fsdp;
  r.has_init_from_scratch = 1;
  r.init_from_scratch = 1;
  jobspec_init(&s);
  assert_int_equal(jobspec_from_pb(&s, &r, &e), 0);
  assert_int_equal(jobspec_validate(&s, false, &e), TY_EINVAL);
  assert_true(tu_has(&e, "fsdp.memory_efficient_load", "drop one of the two"));
  ty_errlist_clear(&e);
}

static void test_pbjson_job_and_enums(void **state) {
  (void)state;
  char buf[64];
  int v;
  assert_string_equal(
      pbjson_enum_name(&trainyard__v1__job_state__descriptor,
                       TRAINYARD__V1__JOB_STATE__JOB_STATE_CANCELLED, buf, sizeof buf),
      "cancelled");
  assert_string_equal(pbjson_enum_name(&trainyard__v1__phase__descriptor,
                                       TRAINYARD__V1__PHASE__PHASE_LOADING, buf, sizeof buf),
                      "loading");
  assert_int_equal(pbjson_enum_value(&trainyard__v1__job_state__descriptor, "running", &v), 0);
  assert_int_equal(v, TRAINYARD__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(pbjson_enum_value(&trainyard__v1__job_state__descriptor, "JOB_STATE_FAILED", &v),
                   0);
  assert_int_equal(v, TRAINYARD__V1__JOB_STATE__JOB_STATE_FAILED);
  assert_int_equal(pbjson_enum_value(&trainyard__v1__job_state__descriptor, "paused", &v), -1);

  /* A job as the REST API writes it, with its normalized spec. */
  jobspec_t spec;
  ty_errlist_t e = TY_ERRLIST_INIT;
  assert_int_equal(tu_check(&spec, "{\"model_path\": \"m\", \"use_lora\": true}", &e), 0);
  json_t *j =
      json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:i, s:s, s:s, s:s, s:n, s:o}", "id", "j1",
                "name", "job", "state", "running", "reason", "all ranks started", "attempt", 2,
                "world_size", 1, "device", "cpu", "max_restarts", 1, "created_at",
                "2026-01-02T03:04:05.006Z", "updated_at", "2026-01-02T03:04:06.000Z", "started_at",
                "2026-01-02T03:04:05.500Z", "finished_at", "spec", jobspec_to_json(&spec));
  Trainyard__V1__Job *job =
      (Trainyard__V1__Job *)pbjson_to_message(j, &trainyard__v1__job__descriptor, "", &e);
  assert_non_null(job);
  assert_string_equal(job->id, "j1");
  assert_true(job->has_state);
  assert_int_equal(job->state, TRAINYARD__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(job->attempt, 2);
  assert_null(job->finished_at); /* null: not set */
  assert_non_null(job->spec);
  jobspec_t back;
  jobspec_init(&back);
  assert_int_equal(jobspec_from_pb(&back, job->spec, &e), 0);
  assert_int_equal(jobspec_validate(&back, false, &e), 0);
  assert_memory_equal(&spec, &back, sizeof spec);
  json_t *again = pbjson_from_message(&job->base, "", &e);
  json_object_del(j, "finished_at"); /* null and absent are the same */
  json_object_del(json_object_get(j, "spec"), "model");
  /* An empty repeated field is absent on the wire. */
  json_object_del(json_object_get(json_object_get(j, "spec"), "train"), "sample_prompts");
  assert_true(json_equal(j, again));
  assert_int_equal(e.len, 0);
  json_decref(again);
  trainyard__v1__job__free_unpacked(job, NULL);
  json_decref(j);

  /* An event and a rank row as the server stores them (REAL columns). */
  j = json_loads(
      "{\"seq\": 12, \"job_id\": \"j1\", \"t\": 1767323045.25, \"type\": "
      "\"progress\", \"data\": {\"attempt\": 1, \"rank\": 1, \"world_size\": 2, "
      "\"phase\": \"loading\", \"step\": 0, \"bytes_loaded\": 1048576, "
      "\"host_peak_bytes\": 73400320, \"load_seconds\": 1.5, \"loss\": null}}",
      0, NULL);
  Trainyard__V1__JobEvent *ev = (Trainyard__V1__JobEvent *)pbjson_to_message(
      j, &trainyard__v1__job_event__descriptor, "", &e);
  assert_non_null(ev);
  assert_int_equal(ev->seq, 12);
  assert_int_equal(ev->data->phase, TRAINYARD__V1__PHASE__PHASE_LOADING);
  assert_int_equal(ev->data->host_peak_bytes, 73400320);
  assert_false(ev->data->has_loss);
  trainyard__v1__job_event__free_unpacked(ev, NULL);
  json_decref(j);
  j = json_loads(
      "{\"job_id\": \"j1\", \"attempt\": 1, \"ranks\": [{\"rank\": 0, \"state\": "
      "\"running\", \"phase\": \"training\", \"pid\": 4242, \"step\": 3, \"loss\": "
      "2.5, \"tokens_per_s\": 100.0, \"reports\": 7, \"last_report_at\": 1767323045.0, "
      "\"exit_code\": null, \"finished_at\": null, \"host_peak_bytes\": 1.0e6}]}",
      0, NULL);
  Trainyard__V1__Attempt *att =
      (Trainyard__V1__Attempt *)pbjson_to_message(j, &trainyard__v1__attempt__descriptor, "", &e);
  assert_non_null(att);
  assert_int_equal(att->n_ranks, 1);
  assert_int_equal(att->ranks[0]->pid, 4242);
  assert_int_equal(att->ranks[0]->host_peak_bytes, 1000000); /* integral real */
  assert_false(att->ranks[0]->has_exit_code);
  trainyard__v1__attempt__free_unpacked(att, NULL);
  json_decref(j);

  j = json_loads(
      "{\"id\": 5, \"state\": \"paused\", \"nope\": 1, \"attempt\": 4294967296, "
      "\"spec\": {\"target_modules\": {}}, \"world_size\": 1.5}",
      0, NULL);
  assert_null(pbjson_to_message(j, &trainyard__v1__job__descriptor, "", &e));
  assert_true(tu_has(&e, "id", "must be a string"));
  assert_true(tu_has(&e, "state", "unknown value paused"));
  assert_true(tu_has(&e, "nope", "unknown field"));
  assert_true(tu_has(&e, "attempt", "out of range"));
  assert_true(tu_has(&e, "spec.target_modules", "must be a list"));
  assert_true(tu_has(&e, "world_size", "must be an integer, got a number"));
  json_decref(j);
  ty_errlist_clear(&e);
}

static void test_error_to_pb(void **state) {
  (void)state;
  ty_errlist_t l = TY_ERRLIST_INIT;
  ty_errlist_add(&l, "world_size", "must be >= 1");
  ty_errlist_add(&l, "", "whole spec");
  Trainyard__V1__Error *e = ty_error_to_pb(TY_EINVAL, "the job spec is invalid", &l);
  assert_non_null(e);
  assert_string_equal(e->code, "INVALID_ARGUMENT");
  assert_string_equal(e->message, "the job spec is invalid");
  assert_int_equal(e->n_details, 2);
  assert_string_equal(e->details[0]->field, "world_size");
  assert_string_equal(e->details[1]->message, "whole spec");
  trainyard__v1__error__free_unpacked(e, NULL);
  ty_errlist_clear(&l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pb_and_json_give_same_struct),
      cmocka_unit_test(test_wire_round_trip),
      cmocka_unit_test(test_pb_errors_match_json),
      cmocka_unit_test(test_pbjson_job_and_enums),
      cmocka_unit_test(test_error_to_pb),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
