/*
 * config.h: every tunable of flint, declared once, and the one way to read them.
 *
 * CONFIG_TABLE lists each setting: its environment variable (FLINT_ and the row's name), its
 * type, the processes that read it, flags, the range of a number, its default and one line
 * that says what it does. Nothing else in flint reads a FLINT_* variable: modules call the
 * typed getters below. README.md's table of environment variables lists the same settings
 * with the same defaults (tests/test_config.c fails when they disagree), and `flint config`
 * prints each one with its value and where the value came from.
 *
 * The rules, the same for every setting of a type:
 *   - unset or empty: the default;
 *   - bool, count, ms, us: the whole text is a whole number in decimal digits (no sign, no
 *     space), within the row's range; a bool is off at 0 and on at any other number;
 *   - size: as fl_parse_size ("512m", "2g", "1048576": a bare number is bytes), within the
 *     row's range;
 *   - memory: as common_parse_memory, the way Spark and `flint submit --memory` read memory
 *     ("512m", "1.5g", "1GiB"; a bare number is MiB: "2048" is 2 GiB), within the row's range;
 *   - real: the whole text is a finite decimal number;
 *   - string, path: any text;
 *   - anything else is invalid: the getters give the default and log one warning that names
 *     the variable and the default used (once per value, not at every read);
 *     config_check says the same as an error, for the readers of CONFIG_STRICT settings,
 *     which refuse to start on it.
 * A row flagged CONFIG_COMPUTED has a default that its reader works out (the machine's
 * memory, $TMPDIR) or none at all: the default's text says which, and the getters give 0
 * (NULL for text) when it is unset, so the reader asks config_given first.
 *
 * Where a value comes from, first first: --conf on the flint command line, the environment,
 * flint-defaults.conf (below), the default. "The environment" in the rules above means any
 * of the three.
 *
 * Threads: the getters read the environment at every call (getenv) and keep no state but the
 * warned-about values, so any thread may call them, and a test that sets a variable sees it
 * at the next read. Modules that read a setting once (a server's limits, the log level,
 * FLINT_SPIN_US) keep the value themselves and say so. Like getenv, the getters must not race
 * with setenv in another thread.
 */
#ifndef FLINT_COMMON_CONFIG_H
#define FLINT_COMMON_CONFIG_H

#include "common/common.h"

/* Types of settings (the TYPE column). */
typedef enum config_type {
  CONFIG_TYPE_BOOL,   /* 0: off, other whole numbers: on */
  CONFIG_TYPE_COUNT,  /* a whole number */
  CONFIG_TYPE_MS,     /* a duration in milliseconds */
  CONFIG_TYPE_US,     /* a duration in microseconds */
  CONFIG_TYPE_SIZE,   /* bytes, as fl_parse_size reads them (a bare number is bytes) */
  CONFIG_TYPE_MEMORY, /* bytes, as common_parse_memory reads them (a bare number is MiB) */
  CONFIG_TYPE_REAL,   /* a decimal number */
  CONFIG_TYPE_STRING, /* text */
  CONFIG_TYPE_PATH,   /* a file or folder */
} config_type;

/* Processes that read a setting (the READERS column): the client is the program that opens
 * a context (a job binary, a test, `flint submit`); TASKS is wherever tasks run (the client
 * in local mode, executors in cluster mode). */
typedef enum config_readers {
  CONFIG_READ_CLIENT = 1,
  CONFIG_READ_DRIVER = 2,
  CONFIG_READ_EXECUTOR = 4,
  CONFIG_READ_SERVERS = CONFIG_READ_DRIVER | CONFIG_READ_EXECUTOR,
  CONFIG_READ_TASKS = CONFIG_READ_CLIENT | CONFIG_READ_EXECUTOR,
  CONFIG_READ_ANY = CONFIG_READ_CLIENT | CONFIG_READ_DRIVER | CONFIG_READ_EXECUTOR,
} config_readers;

/* Flags (the FLAGS column; 0 for none). */
enum {
  CONFIG_COMPUTED = 1 << 0,  /* the reader works the default out, or there is none (above) */
  CONFIG_NO_LIMIT = 1 << 1,  /* 0 means "no limit" (config_limit gives -1 for it) */
  CONFIG_HIDDEN = 1 << 2,    /* a secret: `flint config` says whether it is set, not what */
  CONFIG_INTERNAL = 1 << 3,  /* set by flint for the processes it starts, not by users */
  CONFIG_TEST_ONLY = 1 << 4, /* fault injection for tests and benchmarks */
  CONFIG_STRICT = 1 << 5,    /* its reader refuses an invalid value (config_check), no default */
};

#define CONFIG_MAX_U32 UINT32_MAX
#define CONFIG_MAX_I64 INT64_MAX

/* X(NAME, TYPE, READERS, FLAGS, MIN, MAX, DEFAULT, DESCRIPTION). The variable is FLINT_NAME;
 * MIN and MAX bound the numbers of bool, count, ms, us, size and memory rows (0 and 0 elsewhere);
 * DEFAULT is text the type's rule reads, except in CONFIG_COMPUTED rows. */
#define CONFIG_TABLE(X)                                                                                             \
  /* memory, files and names of a local context and of a client */                                                  \
  X(MEMORY, MEMORY, CLIENT, CONFIG_COMPUTED | CONFIG_STRICT, 0, UINT64_MAX, "60% of the machine's memory",            \
    "memory for cached blocks in local mode when the options give none (of the cgroup's limit if lower)")           \
  X(SHUFFLE_MEMORY, MEMORY, CLIENT, CONFIG_STRICT, 0, UINT64_MAX, "64m",                                              \
    "what one task may sort or aggregate before it spills, when the options give none")                             \
  X(WORK_DIR, PATH, CLIENT, CONFIG_COMPUTED, 0, 0, "$TMPDIR or /tmp",                                               \
    "where a context makes its folder for disk blocks (and local-cluster its cluster's)")                           \
  X(APP_NAME, STRING, CLIENT, CONFIG_COMPUTED, 0, 0, "the program's name",                                          \
    "the application's name on a cluster's driver (flint status) when the options give none")                       \
  X(PROGRESS, BOOL, CLIENT, 0, 0, CONFIG_MAX_I64, "1",                                                             \
    "0: no console progress bars (actions' stages, flint train and flint ml), even on a terminal")                 \
  X(SPIN_US, US, ANY, CONFIG_COMPUTED, 0, 9999999, "200 (servers: 0 on <= 4 cores)",                                \
    "how long hot thread hand-offs spin before they sleep")                                                         \
  /* security */                                                                                                    \
  X(SECRET, STRING, ANY, CONFIG_COMPUTED | CONFIG_HIDDEN, 0, 0, "none",                                             \
    "the cluster's shared secret, presented by every call and connection")                                          \
  X(SECRET_FILE, PATH, ANY, CONFIG_COMPUTED, 0, 0, "none",                                                          \
    "a file holding the shared secret (when FLINT_SECRET is unset)")                                                \
  X(TLS, BOOL, ANY, 0, 0, CONFIG_MAX_I64, "0",                                                                      \
    "TLS on the control plane (gRPC) and the data plane (blocks): every process and client of a cluster alike")    \
  X(TLS_CA, PATH, ANY, CONFIG_COMPUTED, 0, 0, "none",                                                               \
    "PEM certificates that servers' certificates must chain to (required when FLINT_TLS is on)")                   \
  X(TLS_CERT, PATH, ANY, CONFIG_COMPUTED, 0, 0, "none",                                                             \
    "PEM certificate chain a server presents (driver, executors, clients that serve broadcasts)")                  \
  X(TLS_KEY, PATH, ANY, CONFIG_COMPUTED, 0, 0, "none",                                                             \
    "PEM private key of FLINT_TLS_CERT")                                                                            \
  X(TLS_SERVER_NAME, STRING, ANY, CONFIG_COMPUTED, 0, 0, "the server's host",                                       \
    "the name servers' certificates are checked for instead of the address dialled (one certificate for a cluster)") \
  /* the driver's scheduling */                                                                                     \
  X(LOCALITY_WAIT_MS, MS, DRIVER, 0, 0, CONFIG_MAX_I64, "3",                                                        \
    "how long a task waits for the executor that caches its partition")                                             \
  X(NODE_OFFERS, BOOL, DRIVER, 0, 0, CONFIG_MAX_I64, "1",                                                           \
    "0: tasks over cached partitions run only where placed, not on other executors of the host")                    \
  X(SPECULATION, BOOL, DRIVER, 0, 0, CONFIG_MAX_I64, "0",                                                           \
    "1: slow tasks get a backup copy on another executor")                                                          \
  X(SPECULATION_QUANTILE, REAL, DRIVER, 0, 0, 0, "0.75",                                                            \
    "speculation: the share of a stage's tasks that must have succeeded, in (0, 1]")                                \
  X(SPECULATION_MULTIPLIER, REAL, DRIVER, 0, 0, 0, "1.5",                                                           \
    "speculation: a task is slow after this many times the median (at least 1)")                                    \
  X(SPECULATION_MIN_MS, MS, DRIVER, 0, 0, CONFIG_MAX_I64, "100",                                                    \
    "speculation: a task is never slow before this")                                                                \
  X(EXCLUDE_FAILURES, COUNT, DRIVER, 0, 0, CONFIG_MAX_U32, "3",                                                     \
    "an executor on which this many tasks fail in a row is excluded for FLINT_EXCLUDE_MS")                          \
  X(EXCLUDE_MS, MS, DRIVER, 0, 0, CONFIG_MAX_I64, "60000", "how long an excluded executor gets no tasks")           \
  /* liveness of executors, drivers and clients */                                                                  \
  X(EXECUTOR_TIMEOUT_MS, MS, DRIVER, 0, 0, CONFIG_MAX_I64, "10000",                                                 \
    "the driver declares an executor lost after this long without a heartbeat")                                     \
  X(NO_EXECUTOR_TIMEOUT_MS, MS, DRIVER, CONFIG_NO_LIMIT, 0, CONFIG_MAX_I64, "30000",                                \
    "a job with no live executor fails after waiting this long (0: it waits for ever)")                             \
  X(NO_EXECUTOR_WARN_MS, MS, DRIVER, 0, 0, CONFIG_MAX_I64, "15000",                                                 \
    "how often the driver warns while jobs wait with no live executor")                                             \
  X(CLIENT_TIMEOUT_MS, MS, DRIVER, 0, 0, CONFIG_MAX_I64, "30000",                                                   \
    "the driver closes the application of a client silent for this long (at least 300)")                            \
  X(DRIVER_TIMEOUT_MS, MS, EXECUTOR, 0, 1, CONFIG_MAX_I64, "30000",                                                 \
    "an executor that hears nothing from its driver this long drops its state and registers afresh")                \
  X(FETCH_TIMEOUT_MS, MS, EXECUTOR, 0, 1, CONFIG_MAX_I64, "60000",                                                  \
    "how long a block fetch waits on a silent peer before the task reports a fetch failure")                        \
  X(EXECUTOR_SUPERVISE, BOOL, EXECUTOR, 0, 0, CONFIG_MAX_I64, "1",                                                  \
    "0: flint executor runs the executor itself, without a supervising process")                                    \
  /* servers: the data plane (every block server) and gRPC (driver, executors) */                                   \
  X(DP_IDLE_TIMEOUT_MS, MS, ANY, CONFIG_NO_LIMIT, 0, CONFIG_MAX_I64, "60000",                                       \
    "a block server closes a connection idle this long between requests (0: never)")                                \
  X(DP_REQUEST_TIMEOUT_MS, MS, ANY, CONFIG_NO_LIMIT, 0, CONFIG_MAX_I64, "30000",                                    \
    "a block server closes a connection whose request or response stalls this long (0: never)")                     \
  X(DP_MAX_CONNECTIONS, COUNT, ANY, CONFIG_NO_LIMIT, 0, CONFIG_MAX_I64, "1024",                                     \
    "connections a block server keeps open at once; further ones are closed (0: no cap)")                           \
  X(RPC_IDLE_TIMEOUT_MS, MS, SERVERS, CONFIG_NO_LIMIT, 0, CONFIG_MAX_I64, "300000",                                 \
    "a gRPC server closes a connection with no call in progress for this long (0: never)")                          \
  X(RPC_HANDSHAKE_TIMEOUT_MS, MS, SERVERS, CONFIG_NO_LIMIT, 0, CONFIG_MAX_I64, "20000",                             \
    "a gRPC server closes a connection that has not begun HTTP/2 this long after connecting (0: no limit)")         \
  X(RPC_MAX_CONNECTIONS, COUNT, SERVERS, CONFIG_NO_LIMIT, 0, CONFIG_MAX_I64, "1024",                                \
    "connections a gRPC server accepts at once, where gRPC can cap them (0: no cap)")                               \
  X(NO_CRC32C_HW, BOOL, ANY, 0, 0, CONFIG_MAX_I64, "0",                                                             \
    "1: compute CRC32C checksums without the SSE4.2 instruction")                                                   \
  /* diagnostics */                                                                                                 \
  X(UI, BOOL, ANY, CONFIG_COMPUTED, 0, CONFIG_MAX_I64, "1 in a driver, 0 in a local context",                         \
    "the web UI and REST API (docs/ui.md): 0 turns a driver's off; 1 makes a local context serve one")              \
  X(UI_PORT, COUNT, ANY, 0, 0, 65535, "4040",                                                                      \
    "the web UI's port, on the driver's host (taken: the next of 16 is tried; 0: a free port)")                    \
  X(EVENT_LOG_DIR, PATH, ANY, CONFIG_COMPUTED, 0, 0, "unset (no event log)",                                        \
    "a folder where the driver writes each application's events (flint history --dir serves them)")                \
  X(LOG, STRING, ANY, 0, 0, 0, "info", "log level: error, warn, info or debug")                                     \
  X(LOG_FILE, PATH, ANY, CONFIG_COMPUTED, 0, 0, "unset (stderr)",                                                   \
    "a file to which the log's lines are appended instead of stderr")                                               \
  X(CONF_DIR, PATH, ANY, CONFIG_COMPUTED, 0, 0, "unset",                                                            \
    "the folder of flint-defaults.conf (environment or --conf only; see README)")                                  \
  X(TRACE, PATH, ANY, CONFIG_COMPUTED, 0, 0, "unset",                                                               \
    "a file to which every process appends the job path's events (scripts/trace-hops reads it)")                    \
  X(FAULT_EXIT_AFTER_TASKS, COUNT, EXECUTOR, CONFIG_TEST_ONLY, 0, CONFIG_MAX_I64, "0",                              \
    "test only: the executor dies as its K-th task ends, unreported (0: never)")                                    \
  X(FAULT_SLOWDOWN, REAL, EXECUTOR, CONFIG_TEST_ONLY, 0, 0, "1", "test only: every task takes F times as long")     \
  /* local-cluster and the client's side of a cluster */                                                            \
  X(EXECUTABLE, PATH, CLIENT, CONFIG_COMPUTED, 0, 0, "next to libflint",                                            \
    "the flint command that local-cluster starts")                                                                  \
  X(BIN, PATH, CLIENT, CONFIG_COMPUTED, 0, 0, "unset",                                                              \
    "a folder holding the flint command, tried after FLINT_EXECUTABLE and libflint's folder")                       \
  X(LOCAL_CLUSTER_GPUS, COUNT, CLIENT, CONFIG_STRICT, 0, CONFIG_MAX_I64, "0",                                       \
    "local-cluster gives its first G executors --gpu 0 .. G-1")                                                     \
  X(CLIENT_HOST, STRING, CLIENT, CONFIG_COMPUTED, 0, 0, "the address toward the driver",                            \
    "the host executors reach a client's broadcasts at (its block server then listens everywhere)")                 \
  /* training ranks */                                                                                              \
  X(TRAIN_COMM, STRING, TASKS, 0, 0, 0, "nccl",                                                                     \
    "host: ranks on cuda devices use the host (TCP) backend, not NCCL")                                             \
  X(TRAIN_PREFETCH, BOOL, TASKS, 0, 0, CONFIG_MAX_I64, "1",                                                         \
    "0: a training rank's reader makes each batch when asked, with no prefetch thread (to compare)")                \
  X(COMM_HOST, STRING, TASKS, 0, 0, 0, "127.0.0.1", "the address a rank's host-backend endpoint listens on")        \
  X(PS_TIMEOUT_MS, MS, TASKS, 0, 1, CONFIG_MAX_U32, "60000",                                                         \
    "parameter servers: a pull waiting for slower workers, a frame, a call to a server or a backup")                 \
  X(PS_SLOW_WORKER, STRING, TASKS, CONFIG_TEST_ONLY | CONFIG_COMPUTED, 0, 0, "none",                                                  \
    "test only: K:F, parameter-server worker K of every table takes F times as long per clock")                     \
  X(PS_STALL_PUSH, STRING, TASKS, CONFIG_TEST_ONLY, 0, 0, "none",                                                  \
    "test only: K:DIR, the first once-push of worker K (the attempt that makes DIR/stalled) waits for DIR/release")  \
  X(TRAIN_PS_FAIL, STRING, TASKS, CONFIG_TEST_ONLY, 0, 0, "none",                                                   \
    "test only: K:S, training's parameter-server worker K fails once, at step S (its task is retried)")             \
  X(COMM_TIMEOUT_MS, MS, TASKS, 0, 0, CONFIG_MAX_U32, "300000",                                                     \
    "no byte moving for this long inside a host collective is a timeout")                                           \
  X(COMM_SOCKBUF, SIZE, TASKS, 0, 0, CONFIG_MAX_U32, "4m",                                                          \
    "send and receive buffers of every host-backend socket (0: the kernel's autotuning)")                           \
  X(COMM_SINGLE_COPY, BOOL, TASKS, 0, 0, CONFIG_MAX_I64, "1",                                                       \
    "0: ring steps between ranks on one host stay on loopback TCP (no process_vm_readv)")                           \
  X(COMM_SINGLE_COPY_MIN, SIZE, TASKS, 0, 0, CONFIG_MAX_U32, "128k",                                                \
    "the smallest ring step that moves by one process_vm_readv copy (0: none)")                                     \
  X(COMM_SHM, BOOL, TASKS, 0, 0, CONFIG_MAX_I64, "1",                                                               \
    "0: ranks on one host talk over loopback TCP instead of shared-memory rings")                                   \
  X(COMM_CALIBRATE, BOOL, TASKS, 0, 0, CONFIG_MAX_I64, "1",                                                        \
    "0: host communicators skip measuring their links and pick algorithms from fixed parameters")                   \
  /* set by flint for the processes it starts */                                                                    \
  X(EXECUTOR_REPORT_FD, STRING, EXECUTOR, CONFIG_COMPUTED | CONFIG_INTERNAL, 0, 0, "unset",                         \
    "set by flint executor for the executor it supervises: the descriptor its reports go to")                       \
  X(EXECUTOR_RUNNING_FD, STRING, EXECUTOR, CONFIG_COMPUTED | CONFIG_INTERNAL, 0, 0, "unset",                        \
    "set by flint executor for the executor it supervises: the descriptor of its table of running tasks")           \
  X(LOCAL_CLUSTER_DIR, PATH, SERVERS, CONFIG_COMPUTED | CONFIG_INTERNAL, 0, 0, "unset",                             \
    "set by local-cluster for its driver and executors: the cluster's folder, removed by the last one out")

typedef enum config_id {
#define CONFIG_ID_(name, ...) CONFIG_##name,
  CONFIG_TABLE(CONFIG_ID_)
#undef CONFIG_ID_
  CONFIG_SETTINGS /* how many there are */
} config_id;

/* One row of the table. */
typedef struct config_setting {
  const char *name; /* "FLINT_MEMORY" */
  config_type type;
  config_readers readers;
  unsigned flags;
  uint64_t min, max;
  const char *default_text;
  const char *description;
} config_setting;

/* Where a setting's value comes from. */
typedef enum config_source {
  CONFIG_FROM_DEFAULT,      /* unset or empty everywhere */
  CONFIG_FROM_ENVIRONMENT,  /* set in the environment, and valid */
  CONFIG_FROM_INVALID,      /* given (anywhere), but invalid: the default is used */
  CONFIG_FROM_FILE,         /* set in flint-defaults.conf, and valid */
  CONFIG_FROM_COMMAND_LINE, /* set by --conf, and valid */
} config_source;

/* ---- the table ----------------------------------------------------------------------- */

/* Row `id` (static data; id must be below CONFIG_SETTINGS). */
FL_INTERNAL const config_setting *config_setting_of(config_id id);
/* The row of variable `name` ("FLINT_LOG") in *out; false when flint has no such setting. */
FL_INTERNAL bool config_find(const char *name, config_id *out);
/* "bool", "count", "ms", "us", "size", "memory", "real", "string", "path". */
FL_INTERNAL const char *config_type_name(config_type type);
/* The unit of a bare number of the type, as `flint config` shows it: "ms", "us", "bytes"
 * (size), "MiB" (memory), or "". */
FL_INTERNAL const char *config_unit(config_type type);
/* "any", "client", "driver", "executor", "driver, executor" or "client, executor". */
FL_INTERNAL const char *config_readers_text(config_readers readers);

/* ---- reading --------------------------------------------------------------------------- */

/* The setting's text, from the first place that gives it (not empty): --conf
 * (config_set_command_line), the environment, flint-defaults.conf; NULL when none does.
 * `from` (may be NULL): CONFIG_FROM_COMMAND_LINE, _ENVIRONMENT, _FILE or _DEFAULT (none).
 * The first call of any process loads the file (config_file_status). */
FL_INTERNAL const char *config_text_from(config_id id, config_source *from);
FL_INTERNAL const char *config_text(config_id id);

/* ---- flint-defaults.conf and --conf ------------------------------------------------------
 *
 * The file holds one setting a line, `KEY VALUE` or `KEY=VALUE`; KEY is the variable's name
 * (FLINT_MEMORY) or its short form, the rest in any case (memory); blank lines and lines
 * starting with '#' are skipped; spaces around KEY and VALUE are dropped; a later line wins.
 * It is the first of these that exists:
 *   $FLINT_CONF_DIR/flint-defaults.conf (when FLINT_CONF_DIR is set, the only place looked);
 *   ${XDG_CONFIG_HOME:-$HOME/.config}/flint/flint-defaults.conf;
 *   /etc/flint-dataflow/flint-defaults.conf.
 * An unknown key, an internal setting, FLINT_CONF_DIR, a line without a value, or a file
 * that is there but cannot be read makes the whole file invalid (none of it is used); a value is judged by the setting's rules above. */

/* Loads the file once per process (any thread; later calls return the first result): FL_OK
 * when there is none or it is valid, else FL_EINVAL with "FILE:LINE: cause". The flint
 * command refuses to start on an error; fl_context_open logs it as an error once. */
FL_INTERNAL fl_status config_file_status(void);
/* Where the file is looked for, in words, for messages. */
#define CONFIG_FILE_ORDER                                                                                     \
  "looked for $FLINT_CONF_DIR/flint-defaults.conf, else ${XDG_CONFIG_HOME:-~/.config}/flint/flint-defaults.conf " \
  "and /etc/flint-dataflow/flint-defaults.conf"
/* The file in use (NULL: none), and where its line of `id` is (0: not in the file). */
FL_INTERNAL const char *config_file_path(void);
FL_INTERNAL unsigned config_file_line(config_id id);
/* Tests: reads `path` now instead of the file found (NULL: no file); same result as
 * config_file_status. Not while other threads read settings. */
FL_INTERNAL fl_status config_file_use(const char *path);
/* --conf KEY=VALUE: `assignment` overrides the environment and the file for this process and
 * (through the environment, where it is set too) the processes it starts. Call before
 * threads start and before the first read (FLINT_CONF_DIR picks the file). FL_EINVAL for an
 * unknown or internal key or no '='; the value is not judged here (config_check). */
FL_INTERNAL fl_status config_set_command_line(const char *assignment);
/* The row named `key`, in either form the file takes (FLINT_MEMORY, memory). */
FL_INTERNAL bool config_find_key(const char *key, config_id *out);
/* Where the value comes from now (logs nothing). */
FL_INTERNAL config_source config_source_of(config_id id);
/* FL_OK when the variable is unset, empty or valid; else FL_EINVAL with a message that names
 * the variable and says what it should be (logs nothing). */
FL_INTERNAL fl_status config_check(config_id id);
/* Whether the environment gives a valid value (an invalid one is logged as the getters do):
 * readers of CONFIG_COMPUTED settings ask this before a getter. */
FL_INTERNAL bool config_given(config_id id);

/* The typed getters: the environment's value, else the default (0 or NULL for a
 * CONFIG_COMPUTED setting). Each takes settings of its own type only (a bug otherwise);
 * config_string takes string and path settings. Numbers come in the setting's own unit:
 * config_ms gives milliseconds. The text config_string returns is the environment's or the
 * table's: the caller copies it if a later setenv may change it. */
FL_INTERNAL bool config_bool(config_id id);
FL_INTERNAL uint64_t config_count(config_id id);
FL_INTERNAL uint64_t config_ms(config_id id);
FL_INTERNAL uint64_t config_us(config_id id);
FL_INTERNAL uint64_t config_size(config_id id);
FL_INTERNAL uint64_t config_memory(config_id id); /* bytes */
FL_INTERNAL double config_real(config_id id);
FL_INTERNAL const char *config_string(config_id id);
/* The shared secret from FLINT_SECRET or FLINT_SECRET_FILE into *out (NULL when none; the
 * caller frees it). FL_EAUTH naming the file when it cannot be read or is empty. */
FL_INTERNAL fl_status config_secret(char **out);
/* A CONFIG_NO_LIMIT count or duration: its value, or -1 for "no limit" when it is 0. */
FL_INTERNAL int64_t config_limit(config_id id);

#endif /* FLINT_COMMON_CONFIG_H */
