/* jobspec.h - the job spec: one C struct with its defaults, parsed from JSON
 * (REST, files), from protobuf (gRPC, see jobspec_pb.h) and from dotted
 * command-line flags layered over an optional spec file; one validator,
 * driven by one table of rules, that reports every error at once.
 *
 * Field names follow AReaL's configuration (model_path, init_from_scratch,
 * allocation_mode, fsdp.memory_efficient_load, use_lora, lora_rank, ...).
 * The struct holds no pointers: it can be copied with memcpy and needs no
 * free. */
#ifndef TY_API_JOBSPEC_H
#define TY_API_JOBSPEC_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/errors.h"
#include "api/llama_config.h"
#include "common/dtype.h"

#define JOBSPEC_NAME_MAX 128
#define JOBSPEC_PATH_MAX 1024
/* The largest lora_rank: the job spec's bound and the adapters' (worker/model/lora.h). */
#define JOBSPEC_LORA_RANK_MAX 4096
#define JOBSPEC_MODE_MAX 64

typedef enum { JOBSPEC_DEVICE_AUTO = 0, JOBSPEC_DEVICE_CPU, JOBSPEC_DEVICE_CUDA } jobspec_device_t;
/* How the ranks exchange tensors (dist.backend): auto is shm for CPU ranks
 * and nccl for GPU ranks; gloo is TCP between CPU ranks (any hosts). */
typedef enum {
  JOBSPEC_DIST_AUTO = 0,
  JOBSPEC_DIST_SHM,
  JOBSPEC_DIST_GLOO,
  JOBSPEC_DIST_NCCL
} jobspec_dist_backend_t;
typedef enum {
  JOBSPEC_DATA_TEXT = 0,
  JOBSPEC_DATA_U16,
  JOBSPEC_DATA_U32,
  JOBSPEC_DATA_JSONL /* one JSON example a line, tokenized by the worker */
} jobspec_data_format_t;
/* What the examples of a JSONL file are: auto picks by each line's keys. */
typedef enum {
  JOBSPEC_KIND_AUTO = 0,
  JOBSPEC_KIND_TEXT,              /* {"text"} */
  JOBSPEC_KIND_PROMPT_COMPLETION, /* {"prompt", "completion"} */
  JOBSPEC_KIND_MESSAGES,          /* {"messages": [{"role", "content"}, ...]} */
  JOBSPEC_KIND_PREFERENCE         /* {"prompt"?, "chosen", "rejected"}: a pair (dpo) */
} jobspec_data_kind_t;
/* train.objective: what a step minimizes. */
typedef enum {
  JOBSPEC_OBJECTIVE_SFT = 0, /* the mean next-token loss over the counted targets */
  JOBSPEC_OBJECTIVE_DPO      /* direct preference optimization over chosen/rejected pairs */
} jobspec_objective_t;
/* dpo.loss_type, as TRL's DPOTrainer names them. */
typedef enum { JOBSPEC_DPO_SIGMOID = 0, JOBSPEC_DPO_IPO, JOBSPEC_DPO_HINGE } jobspec_dpo_loss_t;
/* Which tokens of an example the loss counts. */
typedef enum {
  JOBSPEC_LOSS_ON_COMPLETION = 0, /* the completion, or the assistant turns */
  JOBSPEC_LOSS_ON_ALL             /* every token */
} jobspec_loss_on_t;
#define JOBSPEC_TEMPLATE_MAX 32
/* train.sample_prompts: at most this many, each under this many bytes. */
#define JOBSPEC_SAMPLE_PROMPTS_MAX 8
#define JOBSPEC_SAMPLE_PROMPT_MAX 1024
/* quantization.bnb_4bit_quant_type: bitsandbytes' two 4-bit code books. */
typedef enum { JOBSPEC_QUANT_NF4 = 0, JOBSPEC_QUANT_FP4 } jobspec_quant_type_t;

/* LoRA target modules, a bit each; JOBSPEC_TARGET_ALL_LINEAR is all seven. */
#define JOBSPEC_TARGETS(X) \
  X(Q, "q_proj")           \
  X(K, "k_proj")           \
  X(V, "v_proj") X(O, "o_proj") X(GATE, "gate_proj") X(UP, "up_proj") X(DOWN, "down_proj")
enum {
#define TY_X(id, name) JOBSPEC_TARGET_BIT_##id,
  JOBSPEC_TARGETS(TY_X)
#undef TY_X
      JOBSPEC_TARGET_COUNT
};
#define JOBSPEC_TARGET_ALL_LINEAR ((1u << JOBSPEC_TARGET_COUNT) - 1u)
/* "q_proj" for bit 0, ...; NULL outside 0 .. JOBSPEC_TARGET_COUNT-1. */
const char *jobspec_target_name(int bit);
/* The bit of a module name ("v_proj" -> 2), or -1. */
int jobspec_target_parse(const char *name);

typedef struct {
  char name[JOBSPEC_NAME_MAX];            /* default "job" */
  char model_path[JOBSPEC_PATH_MAX];      /* "" when unset */
  bool init_from_scratch;                 /* default false */
  bool has_model;                         /* "model" given (not null) */
  llama_config_t model;                   /* meaningful when has_model */
  ty_dtype_t dtype;                       /* compute/storage dtype, default float32 */
  jobspec_device_t device;                /* default auto */
  char allocation_mode[JOBSPEC_MODE_MAX]; /* default "static"; or "fsdp:d<N>" */
  int dp_degree;                          /* N of fsdp:d<N>; 0 for static */
  int world_size;                         /* default 1 */
  bool world_size_given;                  /* set explicitly (not defaulted) */
  struct {
    bool memory_efficient_load; /* default false */
    int bucket_mb;              /* default 64 */
  } fsdp;
  struct {
    jobspec_dist_backend_t backend; /* default auto */
  } dist;
  struct {
    int nodes;          /* hosts the ranks spread over; default 1 */
    int ranks_per_node; /* default 0 (unset): world_size / nodes once validated */
  } resources;
  bool use_lora;               /* default false */
  int lora_rank;               /* default 8 */
  double lora_alpha;           /* default 16 */
  unsigned target_modules;     /* bitmask; default q,k,v,o */
  bool gradient_checkpointing; /* default false */
  bool merge_adapter;          /* LoRA: output_dir/merged/ at the end; default false */
  /* QLoRA: the frozen base's linear projections kept in 4 bits, named as
   * transformers' BitsAndBytesConfig names them. */
  struct {
    bool load_in_4bit;                        /* default false */
    jobspec_quant_type_t bnb_4bit_quant_type; /* default nf4 */
    bool bnb_4bit_use_double_quant;           /* the absmax statistics in 8 bits; default false */
    ty_dtype_t bnb_4bit_compute_dtype;        /* what the blocks dequantize into; default float32 */
  } quantization;
  struct {
    char path[JOBSPEC_PATH_MAX];              /* "" when unset */
    jobspec_data_format_t format;             /* default text */
    int seq_len;                              /* default 128 */
    double eval_fraction;                     /* held-out tail, default 0.05 */
    bool packing;                             /* jsonl: several examples a row; default false */
    char tokenizer[JOBSPEC_PATH_MAX];         /* jsonl: tokenizer folder or file; "": model_path */
    jobspec_data_kind_t kind;                 /* jsonl: default auto */
    char chat_template[JOBSPEC_TEMPLATE_MAX]; /* "": the tokenizer's; else a built-in name */
    jobspec_loss_on_t loss_on;                /* default completion */
  } data;
  struct {
    int steps;            /* default 100 */
    int micro_batch_size; /* default 4 */
    int grad_accum;       /* default 1 */
    double lr;            /* default 3e-4 */
    int warmup_steps;     /* default 0 */
    double weight_decay;  /* default 0 */
    double grad_clip;     /* default 1.0; 0 disables */
    uint64_t seed;        /* default 1234 */
    int checkpoint_every; /* default 0 (only at the end) */
    /* Prompts rank 0 decodes greedily during the run (worker/rank/samples.h);
     * an empty string ends the list (none by default). */
    char sample_prompts[JOBSPEC_SAMPLE_PROMPTS_MAX][JOBSPEC_SAMPLE_PROMPT_MAX];
    int sample_every;          /* steps between samples; default 0: only at the end */
    int sample_max_new_tokens; /* default 32 */
    jobspec_objective_t objective; /* default sft */
  } train;
  /* Preference tuning (train.objective dpo), TRL's DPOConfig names. */
  struct {
    double beta;                  /* default 0.1 */
    jobspec_dpo_loss_t loss_type; /* default sigmoid */
    double label_smoothing;       /* default 0 */
  } dpo;
  int max_restarts;                  /* default 0 */
  char output_dir[JOBSPEC_PATH_MAX]; /* default "runs/<name>" */
} jobspec_t;

/* Fills every default. */
void jobspec_init(jobspec_t *s);

/* Rows of data.seq_len tokens a rank's micro-batch feeds the model:
 * train.micro_batch_size, or with train.objective dpo (which counts pairs)
 * twice that: a pair's chosen and rejected responses. What the model's
 * buffers and the memory rules are sized by. */
int jobspec_micro_batch_rows(const jobspec_t *s);

/* Parses a JSON document (text of len bytes) over the defaults already in
 * s. Syntax errors are reported with line and column; unknown fields,
 * duplicate keys, wrong types and nulls where a value is required are
 * reported with their field path (and a "did you mean" when a known name is
 * close). Every problem found is added to errs. Returns 0 or TY_EINVAL. */
int jobspec_parse_json(jobspec_t *s, const char *text, size_t len, ty_errlist_t *errs);
/* The base model's parameter count (llama_config_num_params): s->model's,
 * or model_path's config.json's; 0 where it cannot be known. What the job
 * view serves (param_count, model_bytes) and the memory estimates use. */
int64_t jobspec_param_count(const jobspec_t *s);

/* The one reader of spec files (the CLI's spec argument, the file a
 * rank is given): at most the size jobspec_parse_json accepts is
 * read (a larger file is refused as too big, never read whole), then
 * parsed over s as jobspec_parse_json does; a problem of the whole document
 * names the file. 0, TY_ENOTFOUND (the file cannot be opened or read) or
 * TY_EINVAL, each problem in errs. */
int jobspec_parse_file(jobspec_t *s, const char *path, ty_errlist_t *errs);
/* The same for an already parsed JSON object. */
int jobspec_from_json(jobspec_t *s, const json_t *root, ty_errlist_t *errs);

/* Applies one dotted flag ("fsdp.memory_efficient_load", "true") over s. */
int jobspec_set_flag(jobspec_t *s, const char *path, const char *value, ty_errlist_t *errs);

/* Command-line form: argv holds an optional spec file path (the first
 * argument that does not start with "--") and "--dotted.path value" pairs
 * (or "--dotted.path=value"), which win over the file. Arguments that are
 * not spec fields are errors unless they are listed in passthrough (a NULL-
 * terminated list of flag names without "--", such as "json"), in which
 * case they are skipped (a passthrough flag takes no value). */
int jobspec_from_args(jobspec_t *s, int argc, char **argv, const char *const *passthrough,
                      ty_errlist_t *errs);

/* Resolves defaults that depend on other fields (output_dir from name,
 * world_size from allocation_mode) and checks every rule of the validation
 * table, adding each failure to errs with its field path and a fix.
 * Returns 0 or TY_EINVAL. Filesystem checks (model_path exists, ...) are
 * made only when check_paths is true. */
int jobspec_validate(jobspec_t *s, bool check_paths, ty_errlist_t *errs);
/* Rule data-holds-a-batch for a JSONL file needs the tokenizer, which the
 * api library does not link: a program that does (the CLI, trainyardd)
 * sets this to its check, which adds the file's problems to errs under
 * data.path. NULL (the default): JSONL files are checked by the worker. */
extern void (*jobspec_jsonl_check)(const jobspec_t *s, ty_errlist_t *errs);

/* How a token file splits into windows of seq_len + 1 tokens (each
 * overlapping the next by one): a held-out tail of eval_fraction of them at
 * the end (at least one when eval_fraction > 0), the training windows
 * before it. */
typedef struct {
  int64_t tokens;     /* in the file */
  int64_t eval;       /* held-out windows */
  int64_t eval_start; /* the tail's first token: the training part's length */
  int64_t train;      /* training windows */
} jobspec_data_split_t;

/* Bytes per token of format f: 1 (text), 2 (u16) or 4 (u32). */
size_t jobspec_data_token_bytes(jobspec_data_format_t f);

/* The layout of a job's data: data.* and the batch of train.* and
 * world_size. */
typedef struct {
  jobspec_data_format_t format;
  int seq_len;
  double eval_fraction;
  int world_size, micro_batch_size, grad_accum;
} jobspec_data_layout_t;

/* Whether a token file (path, of size bytes) holds a whole number of
 * tokens of l->format and at least one global batch of training windows
 * (world_size x micro_batch_size x grad_accum), and fewer than 2^32. The
 * worker's data reader and rule data-holds-a-batch both ask it. 0 with
 * *split filled (may be NULL), or TY_EINVAL with the reason and the fix in
 * msg. */
int jobspec_data_split(const jobspec_data_layout_t *l, const char *path, uint64_t size,
                       jobspec_data_split_t *split, char *msg, size_t msglen);

/* The normalized spec as a new JSON object (the caller owns it). Parsing
 * it back gives the same struct. */
json_t *jobspec_to_json(const jobspec_t *s);

/* Same spec: equal normalized JSON (the Idempotency-Key check). */
bool jobspec_equal(const jobspec_t *a, const jobspec_t *b);

/* The normalized spec as JSON text (pretty: 2-space indent), numbers in
 * their shortest form that parses back to the same value. The caller frees
 * it with free(). */
char *jobspec_dumps(const jobspec_t *s, bool pretty);

/* Server-side rules, which need the server's configuration.
 *
 * Paths: model_path and data.path must resolve (symbolic links and ".."
 * followed) inside one of the read or write roots, output_dir inside one of
 * the write roots. Relative paths resolve against base (NULL: the current
 * directory). Each list is NULL-terminated; a NULL or empty list allows
 * nothing. Paths that do not exist yet resolve through their nearest
 * existing parent. Returns 0 or TY_EINVAL, adding one error per path. */
typedef struct {
  const char *const *read;  /* e.g. {"/srv/models", "/srv/data", NULL} */
  const char *const *write; /* e.g. {"/srv/runs", NULL} */
  const char *base;
  char *output_resolved; /* optional (PATH_MAX bytes): output_dir as it was compared,
                            jobspec_resolve_path's form; "" when it has none or cannot
                            be resolved */
} jobspec_roots_t;
int jobspec_check_roots(const jobspec_t *s, const jobspec_roots_t *roots, ty_errlist_t *errs);

/* The absolute, canonical form of path (relative to base, NULL: the current
 * directory) into out (PATH_MAX bytes), as jobspec_check_roots compares it:
 * symbolic links and ".." followed through the part that exists, the rest
 * appended. Returns 0; -1 when the part that does not exist yet holds "."
 * or ".."; -2 when it starts at a symbolic link that points nowhere. Two
 * paths name one folder exactly when their resolved forms are equal. */
int jobspec_resolve_path(const char *path, const char *base, char *out);

/* device cuda needs one GPU per rank: world_size <= gpus_available.
 * Returns 0 or TY_EINVAL (error on "device"). */
int jobspec_check_devices(const jobspec_t *s, int gpus_available, ty_errlist_t *errs);

/* Ranks on more than one node (resources.nodes > 1) need a dispatcher
 * that reaches other hosts (many_nodes); dispatcher names the one that
 * does not ("the local dispatcher", "trainyard train") in the message. Returns 0 or
 * TY_EINVAL (error on "resources.nodes"). */
int jobspec_check_nodes(const jobspec_t *s, const char *dispatcher, bool many_nodes,
                        ty_errlist_t *errs);

/* This host's memory: /proc/meminfo's MemTotal in bytes, 0 where unknown. */
uint64_t jobspec_host_memory(void);

/* A job of CPU ranks, all on one host of host_bytes (named by host_what,
 * e.g. "MemTotal"), must fit it. Training (training true) holds the weights
 * in float32, the CPU ranks' compute type, and for full training each
 * rank's gradients and AdamW moments beside its shard; a load alone
 * (`trainyard load`) holds them in the job's dtype. On the standard load
 * path each rank places the whole model before it keeps its shard. Training
 * adds each rank's activations (jobspec_activation_bytes). That is a lower
 * bound (buffers and the process are not counted): a job over it can never
 * start, and is refused with the fix (fsdp.memory_efficient_load, or
 * gradient_checkpointing, when that fits). The model's size comes from
 * s->model or model_path's config.json; where that cannot be read, nothing
 * is checked (loading names the problem). Returns 0 or TY_EINVAL. */
/* Bytes of activations one CPU rank of s holds while training the model c
 * (api/model_acts.h), keeping every layer's, or with recompute (activation
 * checkpointing) one layer's and each layer's input. */
uint64_t jobspec_activation_bytes(const jobspec_t *s, const llama_config_t *c, bool recompute);

int jobspec_check_host_memory(const jobspec_t *s, bool training, uint64_t host_bytes,
                              const char *host_what, ty_errlist_t *errs);

/* The host memory one training CPU rank of s holds at least, in bytes, as
 * jobspec_check_host_memory counts it (a cluster dispatcher asks the nodes
 * for it); 0 where the model's size cannot be known. */
uint64_t jobspec_rank_host_bytes(const jobspec_t *s);

/* A job of GPU ranks (device cuda, as the caller resolved it), each
 * allowed device_bytes of its GPU, must fit them. device_what says whence
 * that figure, after "more than the <size>" (e.g. "that
 * --gpu_mem_limit_mib allows each GPU rank"); more is the last way out the
 * message names (e.g. "or a larger --gpu_mem_limit_mib"). Each rank holds
 * its shard in the job's dtype; on the standard load path it places the
 * whole model on the device beside the shard first (on an H200 both load
 * paths' device peaks were exactly these); training every weight holds
 * the float32 shard's gradients and AdamW moments beside it; training,
 * the GPU model's buffers for micro-batches of train.micro_batch_size x
 * data.seq_len tokens (every layer's activations, or one layer's with
 * gradient_checkpointing, the adapters and their gradients: api/model_acts.h's
 * MODEL_ACTS_CUDA) and over several ranks the slots units are gathered
 * into. A lower bound (attention's optional workspace is not counted): a
 * job over it can never start, and is refused with the fix
 * (fsdp.memory_efficient_load or gradient_checkpointing where either would
 * fit). Returns 0 or TY_EINVAL. */
int jobspec_check_device_memory(const jobspec_t *s, uint64_t device_bytes, const char *device_what,
                                const char *more, ty_errlist_t *errs);

/* The table of validation rules, for docs and the validate --rules output:
 * calls fn once per rule with its id, the fields it concerns and why. */
typedef void (*jobspec_rule_fn)(const char *id, const char *fields, const char *why, void *ctx);
void jobspec_rules_each(jobspec_rule_fn fn, void *ctx);
/* When a rule is checked: "spec" (jobspec_validate), "paths"
 * (jobspec_validate with check_paths), "submit" (the server:
 * jobspec_check_roots, jobspec_check_devices) or "load" (the worker).
 * NULL for an unknown id. */
const char *jobspec_rule_stage(const char *id);

/* The table of fields, for docs and validate --fields: calls fn once per
 * field with its dotted path, its type ("string", "int", ...), its default
 * as JSON text, its accepted range ("" when none) and a line of help. */
typedef void (*jobspec_field_fn)(const char *path, const char *type, const char *dflt,
                                 const char *range, const char *help, void *ctx);
void jobspec_fields_each(jobspec_field_fn fn, void *ctx);

#endif
