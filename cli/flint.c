/*
 * flint.c: the flint command: driver, executor, submit, status, ml (cli/ml.c) and train
 * (cli/train.c).
 *
 * Exit status: the job's own status for submit; 2 for a usage error; 1 when something could
 * not be started (missing library, missing flint_main, bad master, unreachable driver).
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "flint/cluster.h"
#include "flint/flint.h"

static const char usage_text[] =
    "usage: flint <command> [options]\n"
    "\n"
    "commands:\n"
    "  submit [--master MASTER] [--memory SIZE] [--name NAME] [--detach] JOB.so [ARGS...]\n"
    "      Runs a job binary: a shared library exporting\n"
    "      int flint_main(fl_context *ctx, int argc, char **argv).\n"
    "      NAME: the application's name in 'flint status' (default: JOB.so's file name).\n"
    "      MASTER: local, local[N], local[*] (default), local-cluster[E,C,MB]\n"
    "      (starts a driver and E executors of C cores and MB megabytes here), or\n"
    "      flint://HOST:PORT: the driver runs the job, its output streams back here\n"
    "      and its exit status is flint's; --detach prints its id and returns.\n"
    "      SIZE: memory for cached blocks in local mode, e.g. 512m or 2g (default:\n"
    "      FLINT_MEMORY, else 60% of the machine's memory).\n"
    "  driver --listen HOST:PORT [--work-dir DIR] [--port-file FILE]\n"
    "      Runs a driver until SIGINT or SIGTERM.\n"
    "  executor --driver HOST:PORT --cores N --memory SIZE [--work-dir DIR] [--host HOST] [--gpu ID]\n"
    "      Runs an executor for that driver until SIGINT or SIGTERM.\n"
    "  status --master flint://HOST:PORT\n"
    "      Lists the driver's executors, applications and jobs.\n"
    "  ml linreg|logreg --data PATH --format libsvm|csv|idx [--master MASTER]\n"
    "      [--labels PATH] [--test PATH [--test-labels PATH]] [--lambda L] [--l1 L]\n"
    "      [--solver auto|normal|lbfgs|gd] [--iterations N] [--tol T] [--partitions P]\n"
    "      [--standardize] [--out MODEL]\n"
    "      Trains least squares or logistic regression (libflint_ml), printing each\n"
    "      iteration and the metrics; 'flint ml --help' explains the options.\n"
    "  train --model mlp|cnn|resnet18|transformer --data fashion-mnist|synthetic-imagenet\n"
    "      [--ranks R] [--device cpu|cuda] [--batch B] [--lr LR] [--warmup EPOCHS] [--epochs N]\n"
    "      [--dp D --tp T --pp P --schedule gpipe|1f1b|interleaved --microbatches M]\n"
    "      [--master M] [--csv PATH] [--svg PATH]\n"
    "      Synchronous data-parallel SGD (libflint_gpu) with a progress line per epoch\n"
    "      and the curves as CSV and SVG; the transformer trains on a data x tensor x\n"
    "      pipeline grid; 'flint train --help' explains the options.\n"
    "\n"
    "options:\n"
    "  --help     this text (also after a command)\n"
    "  --version  the version\n"
    "\n"
    "environment: FLINT_SECRET or FLINT_SECRET_FILE (a shared secret that every process\n"
    "and client must present), FLINT_LOG (error, warn, info, debug).\n";

static volatile sig_atomic_t stop_requested;
static void on_stop(int sig) { stop_requested = 1; }

static void handle_stop_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

/* Matches "--name VALUE" at argv[*i]; sets *value and advances. -1: the value is missing. */
static int option(int argc, char **argv, int *i, const char *name, const char **value) {
  if (strcmp(argv[*i], name) != 0) return 0;
  if (*i + 1 >= argc) return -1;
  *value = argv[++*i];
  return 1;
}

/* A driver or executor that local-cluster[...] started leaves the cluster's folder, which its
 * program may no longer be there to remove (cluster.h: FL_LOCAL_CLUSTER_DIR_ENV): the last
 * one out, whose rmdir finds the folder empty, removes it. A driver's port file goes first. */
static void leave_local_cluster(const char *port_file) {
  const char *dir = getenv(FL_LOCAL_CLUSTER_DIR_ENV);
  if (!dir || !*dir) return;
  if (port_file) unlink(port_file);
  rmdir(dir);
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "flint: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nRun 'flint --help' for usage.\n");
  return 2;
}

static int cmd_submit(int argc, char **argv) {
  const char *master = "local[*]";
  fl_options opts = FL_OPTIONS_INIT;
  const char *name = NULL;
  bool detach = false, in_process = false;
  int i = 0;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--detach") == 0) {
      detach = true;
      continue;
    }
    /* The driver runs a job binary as `flint submit --in-process --master flint://...`. */
    if (strcmp(argv[i], "--in-process") == 0) {
      in_process = true;
      continue;
    }
    if (strcmp(argv[i], "--master") == 0 || strcmp(argv[i], "--memory") == 0 || strcmp(argv[i], "--name") == 0) {
      if (i + 1 >= argc) return usage_error("%s needs a value", argv[i]);
      if (strcmp(argv[i], "--master") == 0) {
        master = argv[++i];
      } else if (strcmp(argv[i], "--name") == 0) {
        if (!*(name = argv[++i])) return usage_error("submit: %s", "--name needs a non-empty name");
      } else if (fl_parse_size(argv[++i], &opts.memory_limit) != FL_OK || opts.memory_limit == 0) {
        return usage_error("--memory '%s' is not a size (examples: 512m, 2g)", argv[i]);
      }
      continue;
    }
    return usage_error("submit: unknown option '%s'", argv[i]);
  }
  if (i >= argc) return usage_error("submit: %s", "no job library given");

  const char *job = argv[i];
  /* The application is named after the job's file, not after this program (every job's). */
  const char *slash = strrchr(job, '/');
  opts.app_name = name ? name : slash ? slash + 1 : job;
  if (strncmp(master, "flint://", 8) == 0 && !in_process) {
    uint64_t id = 0;
    int code = 1;
    handle_stop_signals(); /* an interrupted submit stops its job (on the driver) */
    if (fl_submit(master, job, opts.app_name, argc - i - 1, argv + i + 1, detach, &stop_requested, &id, &code) !=
        FL_OK) {
      fprintf(stderr, "flint submit: %s\n", fl_last_error());
      return 1;
    }
    if (detach) printf("submitted job binary %llu\n", (unsigned long long)id);
    return detach ? 0 : code;
  }
  if (detach) return usage_error("submit: %s", "--detach needs a flint://HOST:PORT master");
  /* Run by a driver, the job's stdout is a pipe to it, which C buffers in blocks: the job's
   * lines would reach its submitter only at its end, and not at all if the driver died
   * first. Line by line, as on a terminal. */
  if (in_process) setvbuf(stdout, NULL, _IOLBF, 0);
  /* dlopen searches the library path for a bare name; a job is a file, so make it a path. */
  char path[4096];
  snprintf(path, sizeof path, "%s%s", strchr(job, '/') ? "" : "./", job);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "flint submit: cannot load job %s: %s\n", job, dlerror());
    return 1;
  }
  fl_main_fn main_fn;
  *(void **)&main_fn = dlsym(lib, FL_MAIN_SYMBOL);
  if (!main_fn) {
    fprintf(stderr, "flint submit: %s does not export %s(fl_context *, int, char **)\n", job,
            FL_MAIN_SYMBOL);
    dlclose(lib);
    return 1;
  }
  fl_context *ctx;
  if (fl_context_open(master, &opts, &ctx) != FL_OK) {
    fprintf(stderr, "flint submit: %s\n", fl_last_error());
    dlclose(lib);
    return 1;
  }
  int rc = main_fn(ctx, argc - i, argv + i);
  fflush(stdout);
  fl_context_close(ctx);
  dlclose(lib);
  return rc;
}

static int cmd_driver(int argc, char **argv) {
  fl_driver_options o = {0};
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    int r;
    if ((r = option(argc, argv, &i, "--listen", &o.listen)) ||
        (r = option(argc, argv, &i, "--work-dir", &o.work_dir)) ||
        (r = option(argc, argv, &i, "--port-file", &o.port_file))) {
      if (r < 0) return usage_error("driver: %s needs a value", argv[i]);
      continue;
    }
    return usage_error("driver: unknown option '%s'", argv[i]);
  }
  if (!o.listen) return usage_error("driver: %s", "--listen HOST:PORT is required");
  handle_stop_signals();
  fl_status st = fl_driver_serve(&o, &stop_requested);
  if (st != FL_OK) fprintf(stderr, "flint driver: %s\n", fl_last_error());
  leave_local_cluster(o.port_file);
  return st == FL_OK ? 0 : 1;
}

/* whole: the command line as run, for the supervised child */
static int cmd_executor(int argc, char **argv, char **whole) {
  fl_executor_options o = {0};
  const char *cores = NULL, *memory = NULL, *gpu = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    int r;
    if ((r = option(argc, argv, &i, "--driver", &o.driver)) ||
        (r = option(argc, argv, &i, "--cores", &cores)) ||
        (r = option(argc, argv, &i, "--memory", &memory)) ||
        (r = option(argc, argv, &i, "--work-dir", &o.work_dir)) ||
        (r = option(argc, argv, &i, "--host", &o.host)) ||
        (r = option(argc, argv, &i, "--gpu", &gpu))) {
      if (r < 0) return usage_error("executor: %s needs a value", argv[i]);
      continue;
    }
    return usage_error("executor: unknown option '%s'", argv[i]);
  }
  if (!o.driver) return usage_error("executor: %s", "--driver HOST:PORT is required");
  if (!cores) return usage_error("executor: %s", "--cores N is required");
  if (!memory) return usage_error("executor: %s", "--memory SIZE is required");
  char *end;
  unsigned long n = strtoul(cores, &end, 10);
  if (*end || n < 1 || n > 1024) return usage_error("executor: --cores '%s' must be 1 to 1024", cores);
  o.cores = (uint32_t)n;
  if (gpu) {
    unsigned long g = strtoul(gpu, &end, 10);
    if (*end || !*gpu || g > 1023) return usage_error("executor: --gpu '%s' must be a GPU id, 0 to 1023", gpu);
    o.has_gpu = true;
    o.gpu = (uint32_t)g;
  }
  if (fl_parse_size(memory, &o.memory) != FL_OK || o.memory < (1u << 20))
    return usage_error("executor: --memory '%s' is not a size of at least 1m (examples: 512m, 2g)", memory);
  handle_stop_signals();
  /* `flint executor` supervises: the executor itself runs in a child (this command again,
   * marked by FLINT_EXECUTOR_REPORT_FD), which a crashing task takes down alone. */
  const char *child = getenv("FLINT_EXECUTOR_REPORT_FD"), *supervise = getenv("FLINT_EXECUTOR_SUPERVISE");
  if (!(child && *child) && !(supervise && strcmp(supervise, "0") == 0)) {
    int rc = fl_executor_supervise(whole, &stop_requested);
    leave_local_cluster(NULL); /* after a child that could not */
    return rc;
  }
  fl_status st = fl_executor_serve(&o, &stop_requested);
  if (st != FL_OK) fprintf(stderr, "flint executor: %s\n", fl_last_error());
  leave_local_cluster(NULL);
  return st == FL_OK ? 0 : 1;
}

static int cmd_status(int argc, char **argv) {
  const char *master = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    int r = option(argc, argv, &i, "--master", &master);
    if (r < 0) return usage_error("status: %s needs a value", argv[i]);
    if (r) continue;
    return usage_error("status: unknown option '%s'", argv[i]);
  }
  if (!master) return usage_error("status: %s", "--master flint://HOST:PORT is required");
  if (fl_print_status(master, stdout) != FL_OK) {
    fprintf(stderr, "flint status: %s\n", fl_last_error());
    return 1;
  }
  return 0;
}

/* `flint train ARGS` runs flint-train ARGS, the program beside this one (cli/cli.h says
 * why). args: main's argv from "train" on, NULL-terminated; its first slot is reused. */
static int run_train_program(char **args) {
  char self[PATH_MAX], path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || n == (ssize_t)sizeof self - 1) { /* the second: cut short */
    fprintf(stderr, "flint train: cannot find this program's own path: %s\n",
            n <= 0 ? strerror(errno) : "too long");
    return 1;
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  int len = snprintf(path, sizeof path, "%.*s/flint-train", slash ? (int)(slash - self) : 0, self);
  if (len < 0 || (size_t)len >= sizeof path) {
    fprintf(stderr, "flint train: the path of flint-train beside %s is too long\n", self);
    return 1;
  }
  args[0] = path;
  execv(path, args);
  fprintf(stderr, "flint train: cannot run %s (flint train is that program): %s\n", path, strerror(errno));
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage_error("%s", "no command given");
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("flint %s\n", FL_VERSION_STRING);
    return 0;
  }
  if (strcmp(argv[1], "submit") == 0) return cmd_submit(argc - 2, argv + 2);
  if (strcmp(argv[1], "driver") == 0) return cmd_driver(argc - 2, argv + 2);
  if (strcmp(argv[1], "executor") == 0) return cmd_executor(argc - 2, argv + 2, argv);
  if (strcmp(argv[1], "status") == 0) return cmd_status(argc - 2, argv + 2);
  if (strcmp(argv[1], "ml") == 0) return cmd_ml(argc - 2, argv + 2);
  if (strcmp(argv[1], "train") == 0) return run_train_program(argv + 1);
  return usage_error("unknown command '%s'", argv[1]);
}
