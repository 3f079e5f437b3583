/* config.h - trainyardd's options: ONE table (name, type, default, bounds,
 * environment variable, help) read, in increasing priority, from the
 * defaults, an optional config file (`name = value` lines), the environment
 * and the command line. --help and every error message come from the table. */
#ifndef TY_SERVER_CONFIG_H
#define TY_SERVER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* X(field, type, default, min, max, env, help). type: STR (char *), INT
 * (int64_t) or SEC (double seconds). Bounds apply to INT and SEC. */
#define SRV_OPTIONS(X)                                                                       \
  X(config, STR, "", 0, 0, "TRAINYARD_CONFIG",                                             \
    "config file of `name = value` lines; the environment and flags win over it")          \
  X(listen, STR, "127.0.0.1:8080", 0, 0, "TRAINYARD_LISTEN",                               \
    "address:port to serve on ([v6addr]:port for IPv6; port 0 picks a free one)")          \
  X(db, STR, "./var/trainyard.db", 0, 0, "TRAINYARD_DB", "SQLite database file")           \
  X(state_dir, STR, "./var", 0, 0, "TRAINYARD_STATE_DIR",                                  \
    "directory for job specs and rank logs (jobs/<id>/...)")                               \
  X(roots, STR, ".", 0, 0, "TRAINYARD_ROOTS",                                              \
    "colon-separated directories that model_path and data.path must be in")                \
  X(output_roots, STR, ".", 0, 0, "TRAINYARD_OUTPUT_ROOTS",                                \
    "colon-separated directories that output_dir must be in (also readable)")              \
  X(tokens, STR, "", 0, 0, "TRAINYARD_TOKENS",                                             \
    "comma-separated API tokens (Authorization: Bearer); required off loopback")           \
  X(cpu_slots, INT, "0", 0, 4096, "TRAINYARD_CPU_SLOTS",                                   \
    "CPU ranks that may run at once (0: the number of online CPUs)")                       \
  X(gpus, INT, "0", 0, 64, "TRAINYARD_GPUS", "GPUs on this host (one rank each)")          \
  X(host_mem_mib, INT, "0", 0, 1073741824, "TRAINYARD_HOST_MEM_MIB",                       \
    "MiB of memory a job's CPU ranks may hold in all (0: the host's MemTotal)")             \
  X(gpu_mem_limit_mib, INT, "0", 0, 16777216, "TRAINYARD_GPU_MEM_LIMIT_MIB",               \
    "MiB of device memory each GPU rank may allocate (0: no cap)")                         \
  X(worker, STR, "", 0, 0, "TRAINYARD_WORKER_BIN",                                         \
    "rank program (default: trainyard-worker beside trainyardd, or ../worker/ in a build tree)")                         \
  X(dispatcher, STR, "local", 0, 0, "TRAINYARD_DISPATCHER",                                \
    "where ranks run: local (this host) or slurm (one sbatch per attempt; README "         \
    "'Running on a Slurm cluster')")                                                       \
  X(advertise_url, STR, "", 0, 0, "TRAINYARD_ADVERTISE_URL",                               \
    "http://host:port at which ranks on other hosts reach this server (empty: from "       \
    "--listen, 127.0.0.1 for a wildcard address)")                                         \
  X(slurm_partition, STR, "", 0, 0, "TRAINYARD_SLURM_PARTITION",                           \
    "slurm: sbatch --partition (empty: the cluster's default)")                            \
  X(slurm_account, STR, "", 0, 0, "TRAINYARD_SLURM_ACCOUNT", "slurm: sbatch --account")    \
  X(slurm_qos, STR, "", 0, 0, "TRAINYARD_SLURM_QOS", "slurm: sbatch --qos")                \
  X(slurm_time, STR, "", 0, 0, "TRAINYARD_SLURM_TIME",                                     \
    "slurm: sbatch --time of each attempt (e.g. 4:00:00; empty: the partition's limit)")   \
  X(slurm_extra, STR, "", 0, 0, "TRAINYARD_SLURM_EXTRA",                                   \
    "slurm: more sbatch options, ';'-separated, each one #SBATCH line (e.g. "              \
    "--constraint=a100;--exclusive)")                                                      \
  X(slurm_cpus_per_rank, INT, "1", 1, 4096, "TRAINYARD_SLURM_CPUS_PER_RANK",               \
    "slurm: sbatch --cpus-per-task")                                                       \
  X(slurm_poll, SEC, "2", 0.05, 600, "TRAINYARD_SLURM_POLL",                               \
    "slurm: seconds between squeue polls of an attempt's batch job")                       \
  X(grace, SEC, "10", 0.05, 3600, "TRAINYARD_GRACE",                                       \
    "seconds between SIGTERM and SIGKILL when ranks are stopped")                          \
  X(heartbeat_timeout, SEC, "60", 0.2, 86400, "TRAINYARD_HEARTBEAT_TIMEOUT",               \
    "a rank silent (no report) this many seconds fails its attempt")                       \
  X(progress_timeout, SEC, "900", 0.2, 604800, "TRAINYARD_PROGRESS_TIMEOUT_S",             \
    "a rank whose phase, step and bytes loaded stay unchanged this long fails")            \
  X(max_body, INT, "1048576", 1024, 67108864, "TRAINYARD_MAX_BODY",                        \
    "largest request body in bytes (413 above it)")                                        \
  X(max_header, INT, "16384", 1024, 1048576, "TRAINYARD_MAX_HEADER",                       \
    "largest request head (line + headers) in bytes")                                      \
  X(max_connections, INT, "512", 4, 65536, "TRAINYARD_MAX_CONNECTIONS",                    \
    "concurrent client connections (429 above it)")                                     \
  X(max_connections_per_ip, INT, "64", 0, 65536, "TRAINYARD_MAX_CONNECTIONS_PER_IP",       \
    "concurrent connections from one client address, refused above it (0: no cap; behind " \
    "a proxy, all clients share its address)")                                             \
  X(request_timeout, SEC, "5", 0.1, 3600, "TRAINYARD_REQUEST_TIMEOUT",                     \
    "seconds a client has to send a whole request (head and body), from connecting or "    \
    "from its previous answer; slower ones are cut off")                                   \
  X(http_threads, INT, "0", 0, 1024, "TRAINYARD_HTTP_THREADS",                             \
    "threads serving REST connections, each many at once (0: the number of online CPUs)")  \
  X(sse_keepalive, SEC, "15", 0.1, 60, "TRAINYARD_SSE_KEEPALIVE",                         \
    "seconds of silence after which an event stream sends a comment line (for proxies)")   \
  X(log_max, INT, "16777216", 4096, 1099511627776, "TRAINYARD_LOG_MAX",                    \
    "bytes kept of each rank's log file (the rest is dropped, with a note)")               \
  X(page_max, INT, "500", 1, 10000, "TRAINYARD_PAGE_MAX", "largest page of GET /v1/jobs")    \
  X(grpc_listen, STR, "", 0, 0, "TRAINYARD_GRPC_LISTEN",                                   \
    "address:port of the gRPC API (trainyard.v1.Trainyard); empty: no gRPC")

typedef struct {
#define TY_X_STR char *
#define TY_X_INT int64_t
#define TY_X_SEC double
#define TY_X(field, type, def, min, max, env, help) TY_X_##type field;
  SRV_OPTIONS(TY_X)
#undef TY_X
#undef TY_X_STR
#undef TY_X_INT
#undef TY_X_SEC
} srv_config_t;

/* Fills every default. Strings are the struct's (srv_config_free). */
void srv_config_init(srv_config_t *c);
void srv_config_free(srv_config_t *c);

/* Sets one option by name (dashes and underscores alike) from text.
 * origin names where the text came from ("--grace", "TRAINYARD_GRACE",
 * "trainyardd.conf:3") for the message. 0, or TY_EINVAL with msg set. */
int srv_config_set(srv_config_t *c, const char *name, const char *value, const char *origin,
                   char *msg, size_t msgsz);

/* Layers config file, environment and argv (argv[0] is skipped) over the
 * defaults. *help is set when --help was given (nothing else is checked).
 * 0, or TY_EINVAL with msg naming the option and the fix. */
int srv_config_load(srv_config_t *c, int argc, char **argv, bool *help, char *msg, size_t msgsz);

/* Cross-option rules: a token is required off loopback; cpu_slots 0 is
 * resolved. 0 or TY_EINVAL with msg. */
int srv_config_check(srv_config_t *c, char *msg, size_t msgsz);

/* True when every address the host part of a listen address resolves to
 * is a loopback address (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104); a name
 * that does not resolve, an empty host and the wildcards are not. Names
 * are resolved (getaddrinfo), never judged by their spelling: "127.lan"
 * may name any host. */
bool srv_config_is_loopback(const char *listen);
/* The same with another resolver (getaddrinfo's contract; its results are
 * freed with freeaddrinfo), for tests. */
struct addrinfo;
typedef int (*srv_resolver_t)(const char *node, const char *service, const struct addrinfo *hints,
                              struct addrinfo **res);
bool srv_listen_is_loopback(const char *listen, srv_resolver_t resolve);

/* --help, generated from the table. */
void srv_config_usage(FILE *f);

#endif
