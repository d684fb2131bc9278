/*
 * cli/cluster.c: the commands of a cluster's processes and of its clients: flint submit,
 * driver, executor and status (cli/cli.h).
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/config.h"
#include "flint/cluster.h"
#include "flint/flint.h"

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
 * program may no longer be there to remove (FLINT_LOCAL_CLUSTER_DIR): the last
 * one out, whose rmdir finds the folder empty, removes it. A driver's port file goes first. */
static void leave_local_cluster(const char *port_file) {
  const char *dir = config_string(CONFIG_LOCAL_CLUSTER_DIR);
  if (!dir) return;
  if (port_file) unlink(port_file);
  rmdir(dir);
}

int cmd_submit(int argc, char **argv) {
  const char *master = "local[*]";
  fl_options opts = FL_OPTIONS_INIT;
  const char *name = NULL;
  bool detach = false, in_process = false;
  int i = 0;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(cli_usage_text, stdout);
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
      if (i + 1 >= argc) return cli_usage_error("%s needs a value", argv[i]);
      if (strcmp(argv[i], "--master") == 0) {
        master = argv[++i];
      } else if (strcmp(argv[i], "--name") == 0) {
        if (!*(name = argv[++i])) return cli_usage_error("submit: %s", "--name needs a non-empty name");
      } else if (fl_parse_size(argv[++i], &opts.memory_limit) != FL_OK || opts.memory_limit == 0) {
        return cli_usage_error("--memory '%s' is not a size (examples: 512m, 2g)", argv[i]);
      }
      continue;
    }
    return cli_usage_error("submit: unknown option '%s'", argv[i]);
  }
  if (i >= argc) return cli_usage_error("submit: %s", "no job library given");

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
  if (detach) return cli_usage_error("submit: %s", "--detach needs a flint://HOST:PORT master");
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

int cmd_driver(int argc, char **argv) {
  fl_driver_options o = {0};
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(cli_usage_text, stdout);
      return 0;
    }
    int r;
    if ((r = option(argc, argv, &i, "--listen", &o.listen)) ||
        (r = option(argc, argv, &i, "--work-dir", &o.work_dir)) ||
        (r = option(argc, argv, &i, "--port-file", &o.port_file))) {
      if (r < 0) return cli_usage_error("driver: %s needs a value", argv[i]);
      continue;
    }
    return cli_usage_error("driver: unknown option '%s'", argv[i]);
  }
  if (!o.listen) return cli_usage_error("driver: %s", "--listen HOST:PORT is required");
  handle_stop_signals();
  fl_status st = fl_driver_serve(&o, &stop_requested);
  if (st != FL_OK) fprintf(stderr, "flint driver: %s\n", fl_last_error());
  leave_local_cluster(o.port_file);
  return st == FL_OK ? 0 : 1;
}

int cmd_executor(int argc, char **argv, char **whole) {
  fl_executor_options o = {0};
  const char *cores = NULL, *memory = NULL, *gpu = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(cli_usage_text, stdout);
      return 0;
    }
    int r;
    if ((r = option(argc, argv, &i, "--driver", &o.driver)) ||
        (r = option(argc, argv, &i, "--cores", &cores)) ||
        (r = option(argc, argv, &i, "--memory", &memory)) ||
        (r = option(argc, argv, &i, "--work-dir", &o.work_dir)) ||
        (r = option(argc, argv, &i, "--host", &o.host)) ||
        (r = option(argc, argv, &i, "--gpu", &gpu))) {
      if (r < 0) return cli_usage_error("executor: %s needs a value", argv[i]);
      continue;
    }
    return cli_usage_error("executor: unknown option '%s'", argv[i]);
  }
  if (!o.driver) return cli_usage_error("executor: %s", "--driver HOST:PORT is required");
  if (!cores) return cli_usage_error("executor: %s", "--cores N is required");
  if (!memory) return cli_usage_error("executor: %s", "--memory SIZE is required");
  char *end;
  unsigned long n = strtoul(cores, &end, 10);
  if (*end || n < 1 || n > 1024) return cli_usage_error("executor: --cores '%s' must be 1 to 1024", cores);
  o.cores = (uint32_t)n;
  if (gpu) {
    unsigned long g = strtoul(gpu, &end, 10);
    if (*end || !*gpu || g > 1023) return cli_usage_error("executor: --gpu '%s' must be a GPU id, 0 to 1023", gpu);
    o.has_gpu = true;
    o.gpu = (uint32_t)g;
  }
  if (fl_parse_size(memory, &o.memory) != FL_OK || o.memory < (1u << 20))
    return cli_usage_error("executor: --memory '%s' is not a size of at least 1m (examples: 512m, 2g)", memory);
  handle_stop_signals();
  /* `flint executor` supervises: the executor itself runs in a child (this command again,
   * marked by FLINT_EXECUTOR_REPORT_FD), which a crashing task takes down alone. */
  if (!config_string(CONFIG_EXECUTOR_REPORT_FD) && config_bool(CONFIG_EXECUTOR_SUPERVISE)) {
    int rc = fl_executor_supervise(whole, &stop_requested);
    leave_local_cluster(NULL); /* after a child that could not */
    return rc;
  }
  fl_status st = fl_executor_serve(&o, &stop_requested);
  if (st != FL_OK) fprintf(stderr, "flint executor: %s\n", fl_last_error());
  leave_local_cluster(NULL);
  return st == FL_OK ? 0 : 1;
}

int cmd_status(int argc, char **argv) {
  const char *master = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(cli_usage_text, stdout);
      return 0;
    }
    int r = option(argc, argv, &i, "--master", &master);
    if (r < 0) return cli_usage_error("status: %s needs a value", argv[i]);
    if (r) continue;
    return cli_usage_error("status: unknown option '%s'", argv[i]);
  }
  if (!master) return cli_usage_error("status: %s", "--master flint://HOST:PORT is required");
  if (fl_print_status(master, stdout) != FL_OK) {
    fprintf(stderr, "flint status: %s\n", fl_last_error());
    return 1;
  }
  return 0;
}

