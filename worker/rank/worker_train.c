/* worker_train.c - RANKENV_MODE=train; see worker_train.h. */
#include "worker/rank/worker_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/rankenv.h"
#include "common/rankproc.h"
#include "worker/dist/comm.h"
#include "worker/dist/fsdp.h"
#include "worker/ckpt/loader.h"
#include "worker/model/lora.h"
#include "common/memstat.h"
#include "worker/model/model.h"
#include "worker/ckpt/model_io.h"
#include "worker/ckpt/merge.h"
#include "worker/ckpt/outputs.h"
#include "worker/ckpt/quant4.h"
#include "common/xalloc.h"
#include "worker/rank/preempt.h"
#include "worker/rank/report.h"
#include "worker/rank/run_metrics.h"
#include "worker/rank/samples.h"
#include "worker/rank/train.h"
#ifdef TRAINYARD_HAVE_CUDA
#include "worker/cuda/placement_cuda.h"
#include "worker/cuda/train_cuda.h"
#endif

/* --- Progress through worker/rank/report.h: to the server, or one JSON line on
 * stdout, and the human-readable line on stderr. --- */

typedef struct {
  int64_t total_steps;
  bool stop; /* the server said this attempt is over */
  int rank, world;
  const loader_stats_t *loaded; /* once the weights are in: every later
                                 * report carries the load's figures */
  double tokens_per_s;          /* the last step's, for the saving and done reports */
  run_metrics_t *curves;        /* rank 0: metrics.jsonl and TensorBoard; else NULL */
  samples_t *samples;           /* rank 0 with train.sample_prompts; else NULL */
  double loss;                  /* the last step's, for the sample reports */
} reporter_t;

/* Rank 0's curves: one point per step into the output_dir's metrics.jsonl
 * and TensorBoard events. A write that fails (a full disk) is said once in
 * the log and stops the curves, not the training. */
static void curves_write(reporter_t *r, const run_point_t *p) {
  if (!r->curves) return;
  char err[512];
  if (run_metrics_write(r->curves, p, err, sizeof err) == 0) return;
  fprintf(stderr, "[rank %d/%d] %s; no more curves are written for this attempt\n", r->rank,
          r->world, err);
  run_metrics_close(r->curves);
  r->curves = NULL;
}

static void on_held_out(void *ctx, int64_t step, double loss) {
  reporter_t *r = ctx;
  run_point_t p = run_point_empty(step);
  p.eval_loss = loss;
  curves_write(r, &p);
}

/* A training step's point: the job's tokens/s is this rank's times the
 * ranks, which step together. */
static void on_step_curves(reporter_t *r, const train_progress_t *tp, const double *dpo) {
  if (!r->curves) return;
  memstat_t ms;
  memstat_read(&ms);
  run_point_t p = run_point_empty(tp->step);
  p.loss = tp->loss;
  p.lr = tp->lr;
  p.grad_norm = tp->grad_norm;
  p.tokens_per_s = tp->tokens_per_s * r->world;
  p.host_peak_bytes = (double)ms.hwm_bytes;
  if (r->loaded) p.device_peak_bytes = (double)r->loaded->device_peak_bytes;
  if (dpo) memcpy(p.dpo, dpo, sizeof p.dpo);
  curves_write(r, &p);
}

/* A report; dpo: the step's DPO metrics [REPORT_DPO_N], or NULL. */
static void emit_dpo(reporter_t *r, report_phase_t phase, int64_t step, double loss, double tps,
                     const loader_stats_t *ls, const char *message, const double *dpo) {
  memstat_t ms;
  memstat_read(&ms);
  report_t rep = {.phase = phase,
                  .step = step,
                  .total_steps = r->total_steps,
                  .loss = loss,
                  .tokens_per_s = tps,
                  .host_peak_bytes = (int64_t)ms.hwm_bytes,
                  .message = message ? message : "",
                  .dpo = dpo};
  if (!ls) ls = r->loaded;
  if (ls) {
    rep.bytes_loaded = (int64_t)ls->bytes_read;
    rep.bytes_total = (int64_t)ls->bytes_total;
    rep.device_peak_bytes = (int64_t)ls->device_peak_bytes;
    rep.load_seconds = ls->load_seconds;
  }
  if (report_send(&rep) == TY_EPRECONDITION) r->stop = true;
}

static void emit(reporter_t *r, report_phase_t phase, int64_t step, double loss, double tps,
                 const loader_stats_t *ls, const char *message) {
  emit_dpo(r, phase, step, loss, tps, ls, message, NULL);
}

/* A sample of train.sample_prompts: a report of its own. */
static void on_sample(void *ctx, int64_t step, const char *prompt, const char *text) {
  reporter_t *r = ctx;
  memstat_t ms;
  memstat_read(&ms);
  report_t rep = {.phase = REPORT_PHASE_TRAINING,
                  .step = step,
                  .total_steps = r->total_steps,
                  .loss = r->loss,
                  .tokens_per_s = r->tokens_per_s,
                  .host_peak_bytes = (int64_t)ms.hwm_bytes,
                  .message = "",
                  .sample_prompt = prompt,
                  .sample_text = text};
  if (report_send(&rep) == TY_EPRECONDITION) r->stop = true;
}

/* Samples at a step boundary; one that fails is said in the log and ends
 * the samples, not the training. */
static void sample(reporter_t *r, int64_t step, bool final) {
  char err[512];
  if (!samples_at_step(r->samples, step, final, on_sample, r, err, sizeof err)) return;
  fprintf(stderr, "[rank %d/%d] %s; no more samples are made for this attempt\n", r->rank, r->world,
          err);
  samples_free(r->samples);
  r->samples = NULL;
}

static int on_progress(void *ctx, const train_progress_t *p) {
  reporter_t *r = ctx;
  char msg[256];
  snprintf(msg, sizeof msg, "%s", p->message);
  if (isfinite(p->eval_loss))
    snprintf(msg, sizeof msg, "%s%seval loss %.4f", p->message, *p->message ? "; " : "",
             p->eval_loss);
  if (p->tokens_per_s > 0) r->tokens_per_s = p->tokens_per_s;
  double dpo[REPORT_DPO_N];
  if (p->dpo) dpo_report(p->dpo, dpo);
  if (p->phase == REPORT_PHASE_TRAINING) on_step_curves(r, p, p->dpo ? dpo : NULL);
  /* A save keeps the rate of the steps before it, as the done report does. */
  double tps = p->phase != REPORT_PHASE_SAVING ? p->tokens_per_s : r->tokens_per_s;
  /* Scoring the reference, its pairs are the report's counts. */
  const loader_stats_t pairs = {.bytes_read = (uint64_t)p->done, .bytes_total = (uint64_t)p->total};
  emit_dpo(r, p->phase, p->step, p->loss, tps, p->phase == REPORT_PHASE_REFERENCE ? &pairs : NULL,
           msg, p->dpo ? dpo : NULL);
  /* The report's own line shows no message while loading or training:
   * events (resumed, checkpoint written) get a log line of their own. */
  if (*msg) fprintf(stderr, "[rank %d/%d] %s\n", r->rank, r->world, msg);
  if (p->phase == REPORT_PHASE_TRAINING) {
    r->loss = p->loss;
    sample(r, p->step, false);
  }
  return r->stop ? TY_ECANCELLED : 0;
}

/* The model's shape: spec.model, or the checkpoint's config.json. */
static int job_config(const jobspec_t *s, llama_config_t *cfg, char *err, size_t errlen) {
  if (s->init_from_scratch) {
    *cfg = s->model;
    return 0;
  }
  llama_config_init(cfg);
  return model_io_read_config(s->model_path, cfg, err, errlen);
}

/* The loader's progress as "loading" reports, at most one a second: what a
 * person watching a long load sees move, and what tells the server's
 * progress_timeout that the rank is not stuck. */
typedef struct {
  reporter_t *rep;
  double last; /* ty_mono_s() of the last report */
} load_progress_t;

static void on_load_progress(void *ctx, uint64_t done, uint64_t total) {
  load_progress_t *p = ctx;
  if (!loader_progress_due(&p->last, done, total)) return;
  loader_stats_t st = {.bytes_read = done, .bytes_total = total};
  emit(p->rep, REPORT_PHASE_LOADING, 0, NAN, 0, &st, NULL);
}

/* Tokenizing a JSONL file (this rank or the one that builds the examples
 * file): "tokenizing" reports of its bytes, at most one a second. */
static int on_tokenize_progress(void *ctx, uint64_t done, uint64_t total) {
  load_progress_t *p = ctx;
  if (loader_progress_due(&p->last, done, total)) {
    loader_stats_t st = {.bytes_read = done, .bytes_total = total};
    emit(p->rep, REPORT_PHASE_TOKENIZING, 0, NAN, 0, &st, NULL);
  }
  return p->rep->stop ? TY_ECANCELLED : 0;
}

/* This rank's float32 shards of the checkpoint (or the seeded
 * initialisation) in host memory, by the loader's path the spec picks, as
 * an fsdp over m; with quantization.load_in_4bit the linear projections
 * quantized as they load. */
static int load_span(const jobspec_t *s, comm_t *comm, placement_t *pl, const llama_config_t *cfg,
                     model_t *m, fsdp_mode_t mode, reporter_t *rep, fsdp_t **f, loader_stats_t *ls,
                     char *err, size_t errlen) {
  load_progress_t prog = {rep, ty_mono_s()};
  const ckpt_q4_kind_t k = worker_q4_kind(s);
  const loader_q4_t q4 = {.type = k.type,
                          .double_quant = k.double_quant,
                          .compute = k.compute,
                          .mean = worker_q4_mean,
                          .mean_ctx = comm};
  loader_opts_t o = {.rank = comm_rank(comm),
                     .world_size = comm_world_size(comm),
                     .dtype = TY_DTYPE_F32,
                     .memory_efficient = s->fsdp.memory_efficient_load,
                     .bucket_bytes = (size_t)s->fsdp.bucket_mb << 20,
                     .seed = s->train.seed,
                     .pl = pl,
                     .q4 = s->quantization.load_in_4bit ? &q4 : NULL,
                     .progress = on_load_progress,
                     .progress_ctx = &prog};
  loader_shard_t *shard;
  int rc = s->init_from_scratch ? loader_init_scratch(cfg, &o, &shard, ls, err, errlen)
                                : loader_load(s->model_path, &o, &shard, ls, err, errlen);
  return rc ? rc : fsdp_create(f, m, comm, shard, mode, err, errlen);
}

/* What a rank trains, as the host holds it: the model (the CPU model with
 * its weights or without (several ranks), or for device cuda a
 * weights-only or table-only model, or the shape alone), this rank's
 * shards, the adapters, and the backend over them. */
typedef struct {
  model_t *m;
  model_t shape; /* device cuda, LoRA: the host knows the model's shape only */
  fsdp_t *f;
  lora_t *lo;
  train_backend_t b;
#ifdef TRAINYARD_HAVE_CUDA
  train_cuda_t *tc;
#endif
} trained_t;

static void trained_free(trained_t *t) {
  train_backend_free(&t->b);
  lora_free(t->lo);
#ifdef TRAINYARD_HAVE_CUDA
  train_cuda_free(t->tc);
#endif
  fsdp_free(t->f);
  model_free(t->m);
}

/* The model the loop's passes read on the host: the CPU model, or on
 * device cuda the host's weights or table, or the shape alone. */
static model_t *host_model(trained_t *t) {
  return t->m ? t->m : &t->shape;
}

/* The host's side of the model: on the CPU one rank fills the model's own
 * buffer from the checkpoint or the seeded initialisation, several ranks
 * create the model without one and load only their shards (the loader's
 * standard or memory-efficient path, as fsdp.memory_efficient_load says),
 * in float32, the compute type. On device cuda (whose base weights the
 * device loads itself): LoRA, the model's shape; every weight on one GPU,
 * a weights-only model the device's weights come down into (the trained
 * span, what the outputs are written from); over several GPUs, this rank's
 * shards in host memory (an FSDP_SPAN over a table-only model). */
static int build_model(const jobspec_t *s, comm_t *comm, placement_t *pl, const llama_config_t *cfg,
                       bool cuda, reporter_t *rep, trained_t *t, loader_stats_t *ls, char *err,
                       size_t errlen) {
  const model_mode_t mode = s->use_lora ? MODEL_TRAIN_LORA : MODEL_TRAIN_FULL;
  const int B = jobspec_micro_batch_rows(s), T = s->data.seq_len;
  const bool one = comm_world_size(comm) == 1;
  if (cuda && s->use_lora) return model_init_shape(&t->shape, cfg, B, T, mode, err, errlen);
  if (cuda && one) return model_create_weights(&t->m, cfg, B, T, mode, err, errlen);
  if (cuda) {
    int rc = model_create_table(&t->m, cfg, B, T, mode, err, errlen);
    return rc ? rc : load_span(s, comm, pl, cfg, t->m, FSDP_SPAN, rep, &t->f, ls, err, errlen);
  }
  /* Several ranks, or a 4-bit base (whose layers are dequantized one at a
   * time as gathered units are): no whole-model buffers, only activations. */
  const bool whole = one && !s->quantization.load_in_4bit;
  int rc = (whole ? model_create : model_create_unowned)(&t->m, cfg, B, T, mode, err, errlen);
  if (!rc && whole) {
    load_progress_t prog = {rep, ty_mono_s()};
    if (!s->init_from_scratch)
      rc = model_io_load(t->m, s->model_path, on_load_progress, &prog, ls, err, errlen);
    else
      model_io_init_scratch(t->m, s->train.seed);
  } else if (!rc) {
    rc = load_span(s, comm, pl, cfg, t->m, s->use_lora ? FSDP_FROZEN : FSDP_FULL, rep, &t->f, ls,
                   err, errlen);
  }
  if (!rc && s->gradient_checkpointing) rc = model_recompute_layers(t->m, err, errlen);
  return rc;
}

/* The host's side of the backend: the shards', or the host model's. */
static int host_backend(trained_t *t, train_backend_t *b, char *err, size_t errlen) {
  return t->f ? fsdp_backend(b, t->f, t->lo, err, errlen)
              : train_backend_host(b, host_model(t), t->lo, err, errlen);
}

/* What this worker trains on device cuda: LoRA adapters on one GPU per
 * rank, sharded over several through NCCL; every weight in float32, on one
 * GPU or sharded over several. 0, or TY_EUNAVAILABLE / TY_EUNIMPLEMENTED
 * with the reason and the fix. */
static int cuda_supported(const jobspec_t *s, char *err, size_t errlen) {
#ifndef TRAINYARD_HAVE_CUDA
  (void)s;
  return ty_errf(err, errlen, TY_EUNAVAILABLE, "%s", PLACEMENT_NO_CUDA_MSG);
#else
  if (!s->use_lora && s->dtype != TY_DTYPE_F32)
    return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                   "device cuda: training every weight keeps float32 weights on the GPU; set "
                   "dtype float32 (or use_lora true to train adapters over %s weights)",
                   ty_dtype_name(s->dtype));
#ifndef TRAINYARD_HAVE_NCCL
  if (s->world_size > 1)
    return ty_errf(err, errlen, TY_EUNAVAILABLE,
                   "device cuda: world_size %d needs NCCL, and this worker was built without "
                   "it; rebuild where NCCL is installed, set world_size 1, or \"device\": "
                   "\"cpu\" to shard across CPU ranks",
                   s->world_size);
#endif
  int ndev;
  return placement_cuda_devices(&ndev, err, errlen);
#endif
}

#ifdef TRAINYARD_HAVE_CUDA
/* device cuda: the passes on the rank's GPU (rankenv_gpu, as the nccl
 * comm picks it: under Slurm the rank's index on its node; the server
 * makes each rank's GPU its only one, CUDA_VISIBLE_DEVICES), with the base
 * weights (this rank's shard) loaded there, over the host's span. */
static int build_cuda(const jobspec_t *s, comm_t *comm, const llama_config_t *cfg, trained_t *t,
                      loader_stats_t *ls, char *err, size_t errlen) {
  const train_cuda_trained_t tr = {.lora = t->lo, .host = t->f ? NULL : t->m, .span = t->f};
  int ndev, gpu;
  train_device_t dev;
  train_backend_t host;
  int rc = placement_cuda_devices(&ndev, err, errlen);
  if (!rc) rc = rankenv_gpu(comm_rank(comm), ndev, &gpu, err, errlen);
  if (!rc)
    rc = train_cuda_create(&t->tc, s, cfg, comm, gpu, &tr, jobspec_micro_batch_rows(s),
                           s->data.seq_len, ls, &dev, err, errlen);
  if (!rc) rc = host_backend(t, &host, err, errlen);
  if (!rc && (rc = train_backend_device(&t->b, &host, &dev, comm_world_size(comm), err, errlen)))
    train_backend_free(&host);
  return rc;
}
#endif

int worker_train_main(const worker_env_t *e) {
  char err[1024] = "";
  jobspec_t spec;
  reporter_t rep = {.rank = e->rank, .world = e->world_size, .loss = NAN};
  comm_t *comm = NULL;
  trained_t t = {0};
  llama_config_t cfg;
  placement_t pl;
  placement_cpu_init(&pl);
  loader_stats_t ls = {0};
  int rc = report_open(e);
  if (rc) {
    fprintf(stderr, "trainyard-worker: cannot set up progress reports (libcurl)\n");
    return 1;
  }
  emit(&rep, REPORT_PHASE_STARTING, 0, NAN, 0, NULL, "");
  preempt_install(); /* SIGTERM before the first step: preempted, at once */
  rc = worker_read_spec(e->spec_path, &spec, err, sizeof err);
  if (!rc && spec.world_size != e->world_size)
    rc = ty_errf(err, sizeof err, TY_EINVAL,
                 "the spec asks for world_size %d, and this rank was started as one of %d "
                 "(%s); start the job with trainyard train or through "
                 "trainyardd, which start every rank",
                 spec.world_size, e->world_size, rankenv_name(RANKENV_WORLD_SIZE));
  /* Never the CPU model under a cuda label: a job it cannot run there fails. */
  const bool cuda = !rc && spec.device == JOBSPEC_DEVICE_CUDA;
  if (cuda) rc = cuda_supported(&spec, err, sizeof err);
  if (!rc) {
    rep.total_steps = spec.train.steps;
    rc = comm_open_env(&comm, err, sizeof err);
  }
  /* The model's shape, and whether the data holds a global batch of it,
   * before any weight is read: a job that cannot train fails in a moment,
   * not after loading a large checkpoint. */
  if (!rc) rc = job_config(&spec, &cfg, err, sizeof err);
  data_prepared_t prep;
  if (!rc && spec.data.format == JOBSPEC_DATA_JSONL) {
    load_progress_t tp = {&rep, 0};
    emit(&rep, REPORT_PHASE_TOKENIZING, 0, NAN, 0, NULL, spec.data.path);
    rc = train_data_prepare(&spec, cfg.vocab_size, NULL, on_tokenize_progress, &tp, &prep, err,
                            sizeof err);
  }
  const data_prepared_t *prepared = spec.data.format == JOBSPEC_DATA_JSONL ? &prep : NULL;
  char note[512] = "";
  if (!rc)
    rc = train_data_check(&spec, prepared, cfg.vocab_size, comm_rank(comm), comm_world_size(comm),
                          note, sizeof note, err, sizeof err);
  if (!rc && note[0] && comm_rank(comm) == 0)
    fprintf(stderr, "[rank 0/%d] data %s\n", comm_world_size(comm), note);
  /* The host's side of the model, the adapters over it, and the backend:
   * on the CPU the host's, on device cuda the GPU's passes over the host's
   * span. */
  if (!rc) {
    emit(&rep, REPORT_PHASE_LOADING, 0, NAN, 0, NULL,
         spec.init_from_scratch ? "initialising" : spec.model_path);
    rc = build_model(&spec, comm, &pl, &cfg, cuda, &rep, &t, &ls, err, sizeof err);
  }
  if (!rc && !cuda && (t.f || !spec.init_from_scratch)) {
    rep.loaded = &ls;
    char msg[256], q4[128] = "";
    if (spec.quantization.load_in_4bit)
      snprintf(q4, sizeof q4, ", the linear projections in 4 bits (%s%s): %.1f MiB a rank",
               spec.quantization.bnb_4bit_quant_type == JOBSPEC_QUANT_FP4 ? "fp4" : "nf4",
               spec.quantization.bnb_4bit_use_double_quant ? ", double quantization" : "",
               (double)ls.shard_bytes / (1024.0 * 1024.0));
    snprintf(msg, sizeof msg, "%s%s; activations %.1f MiB a rank%s",
             t.f ? "shards loaded" : "weights loaded", q4,
             (double)model_activation_bytes(t.m) / (1024.0 * 1024.0),
             spec.gradient_checkpointing ? " (gradient_checkpointing)" : "");
    emit(&rep, REPORT_PHASE_LOADING, 0, NAN, 0, NULL, msg);
  }
  if (!rc && spec.use_lora) {
    rc = lora_create(&t.lo, host_model(&t), spec.lora_rank, spec.lora_alpha, spec.target_modules,
                     err, sizeof err);
    if (!rc) lora_init(t.lo, spec.train.seed);
  }
  if (!rc)
    rc = samples_open(&rep.samples, &spec, &cfg, host_model(&t), t.f, t.lo, comm_rank(comm), err,
                      sizeof err);
  if (!rc && !cuda) rc = host_backend(&t, &t.b, err, sizeof err);
#ifdef TRAINYARD_HAVE_CUDA
  if (!rc && cuda) {
    rc = build_cuda(&spec, comm, &cfg, &t, &ls, err, sizeof err);
    if (!rc) {
      rep.loaded = &ls;
      char msg[160];
      snprintf(msg, sizeof msg, "weights loaded onto the GPU; training buffers %.1f MiB a rank%s",
               (double)train_cuda_buffer_bytes(t.tc) / (1024.0 * 1024.0),
               spec.gradient_checkpointing ? " (gradient_checkpointing)" : "");
      emit(&rep, REPORT_PHASE_LOADING, 0, NAN, 0, NULL, msg);
    }
  }
#endif
  train_result_t res = {0};
  if (!rc) {
    train_args_t a = {.spec = &spec,
                      .comm = comm,
                      .backend = &t.b,
                      .progress = on_progress,
                      .progress_ctx = &rep,
                      .held_out_done = on_held_out,
                      .eval_windows = 16,
                      .data = prepared};
    /* Rank 0 keeps the job's curves in its output_dir; a folder that cannot
     * take them fails the job before its first step. */
    if (comm_rank(comm) == 0) rc = run_metrics_open(&rep.curves, spec.output_dir, err, sizeof err);
    if (!rc) rc = train_run(&a, &res, err, sizeof err);
    if (!rc) sample(&rep, res.steps_done, true);
  }
  const ckpt_q4_kind_t q4k = worker_q4_kind(&spec);
  if (!rc && !res.preempted) {
    /* Every rank takes part in gathering sharded weights; rank 0 writes. */
    if (comm_rank(comm) == 0)
      emit(&rep, REPORT_PHASE_SAVING, res.steps_done, res.last_loss, rep.tokens_per_s, NULL,
           spec.output_dir);
    if (t.lo && comm_rank(comm) == 0) {
      rc = outputs_write_adapter(spec.output_dir, t.lo, spec.model_path, err, sizeof err);
      if (!rc && spec.merge_adapter)
        rc = merge_write_outputs(spec.output_dir, t.lo, spec.model_path,
                                 spec.quantization.load_in_4bit ? &q4k : NULL, err, sizeof err);
    } else if (!t.lo && t.f) {
      rc = fsdp_write_model(t.f, spec.output_dir, &cfg, err, sizeof err);
    } else if (!t.lo && comm_rank(comm) == 0) {
      rc = outputs_write_model(spec.output_dir, t.m, &cfg, err, sizeof err);
    }
  }
  if (!rc && res.preempted) {
    ty_info("stopped on SIGTERM after step %lld, its checkpoint written",
            (long long)res.steps_done);
  } else if (!rc) {
    char msg[160] = "";
    if (isfinite(res.eval_loss_start) && isfinite(res.eval_loss_end))
      snprintf(msg, sizeof msg, "held-out loss %.4f -> %.4f", res.eval_loss_start,
               res.eval_loss_end);
    emit(&rep, REPORT_PHASE_DONE, res.steps_done, res.last_loss, rep.tokens_per_s, NULL, msg);
  } else {
    emit(&rep, REPORT_PHASE_FAILED, 0, NAN, 0, NULL, err);
    ty_error("%s", err);
  }
  run_metrics_close(rep.curves);
  samples_free(rep.samples);
  trained_free(&t);
  comm_close(comm);
  report_close();
  return rc ? 1 : res.preempted ? RANKPROC_EXIT_PREEMPTED : 0;
}
