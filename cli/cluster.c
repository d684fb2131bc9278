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

/* A driver or executor that local-cluster[...] started leaves the cluster's folder, which its
 * program may no longer be there to remove (FLINT_LOCAL_CLUSTER_DIR): the last
 * one out, whose rmdir finds the folder empty, removes it. A driver's port file goes first. */
static void leave_local_cluster(const char *port_file) {
  const char *dir = config_string(CONFIG_LOCAL_CLUSTER_DIR);
  if (!dir) return;
  if (port_file) unlink(port_file);
  rmdir(dir);
}

/* getopt_long from argv[0] on: each command gets the arguments after its name, whose slot
 * before them (the command's name) is getopt's argv[0]. optind = 0 starts getopt afresh. */
#define GETOPT(argc, argv, shortopts, longopts) \
  getopt_long((argc) + 1, (argv) - 1, (shortopts), (longopts), NULL)

/* Prints a job binary's state as "key: value" lines (flint submit --status). */
static void print_submission(const fl_submission_info *s) {
  printf("submission: %llu\n", (unsigned long long)s->id);
  printf("name: %s\n", s->name);
  printf("application: %s\n", s->app_name);
  printf("state: %s\n", s->state);
  if (strcmp(s->state, "running") != 0) {
    if (s->signal) printf("signal: %d (%s)\n", s->signal, strsignal(s->signal));
    else printf("exit status: %d\n", s->exit_code);
  }
  printf("seconds: %.1f\n", s->seconds);
  printf("output: %llu bytes on stdout, %llu on stderr\n", (unsigned long long)s->stdout_bytes,
         (unsigned long long)s->stderr_bytes);
}

/* flint submit --status ID, --logs ID [--follow], --kill ID: what = "status", "logs" or
 * "kill". Following ends with the submission, whose exit status it returns; a Ctrl-C stops
 * the following only (status 130, as a shell reports an interrupted command). */
static int watch_submission(const char *what, const char *master, uint64_t id, bool follow) {
  if (strncmp(master, "flint://", 8) != 0)
    return cli_usage_error("submit", "--%s needs a flint://HOST:PORT master, not '%s'", what, master);
  fl_submission_info info;
  fl_status st;
  if (strcmp(what, "status") == 0) {
    if ((st = fl_submission_status(master, id, &info)) == FL_OK) print_submission(&info);
  } else if (strcmp(what, "logs") == 0 && follow) {
    handle_stop_signals();
    int code = 1;
    st = fl_submission_follow(master, id, stdout, stderr, &stop_requested, &code);
    if (st == FL_OK) return code;
    if (st == FL_ECANCELLED) {
      cli_failure("submit", "%s (--kill %llu ends it)", fl_last_error(), (unsigned long long)id);
      return 130;
    }
  } else if (strcmp(what, "logs") == 0) {
    st = fl_submission_logs(master, id, stdout, stderr);
  } else {
    bool was_running = false;
    if ((st = fl_submission_kill(master, id, &was_running, &info)) != FL_OK)
      return cli_failure("submit", "%s", fl_last_error());
    if (!was_running)
      return cli_failure("submit", "submission %llu had already ended (%s, %s %d)", (unsigned long long)id,
                         info.state, info.signal ? "signal" : "exit status", info.signal ? info.signal : info.exit_code);
    if (strcmp(info.state, "running") == 0)
      return cli_failure("submit", "submission %llu is still running after SIGKILL", (unsigned long long)id);
    printf("killed submission %llu\n", (unsigned long long)id);
  }
  return st == FL_OK ? 0 : cli_failure("submit", "%s", fl_last_error());
}

int cmd_submit(int argc, char **argv) {
  enum { OPT_MASTER = 256, OPT_MEMORY, OPT_NAME, OPT_DETACH, OPT_IN_PROCESS, OPT_STATUS, OPT_LOGS, OPT_KILL,
         OPT_FOLLOW = 'f' };
  static const struct option longopts[] = {
      {"master", required_argument, NULL, OPT_MASTER},
      {"memory", required_argument, NULL, OPT_MEMORY},
      {"name", required_argument, NULL, OPT_NAME},
      {"detach", no_argument, NULL, OPT_DETACH},
      {"status", required_argument, NULL, OPT_STATUS},
      {"logs", required_argument, NULL, OPT_LOGS},
      {"kill", required_argument, NULL, OPT_KILL},
      {"follow", no_argument, NULL, OPT_FOLLOW},
      /* The driver runs a job binary as `flint submit --in-process --master flint://...`. */
      {"in-process", no_argument, NULL, OPT_IN_PROCESS},
      CLI_COMMON_LONG_OPTIONS,
      {0}};
  const char *master = "local[*]";
  fl_options opts = FL_OPTIONS_INIT;
  const char *name = NULL;
  bool detach = false, in_process = false, follow = false;
  const char *watch = NULL; /* "status", "logs" or "kill" */
  uint64_t watch_id = 0;
  int c;
  optind = 0;
  /* "+": options end at the job library; what follows is the job's own argv. */
  while ((c = GETOPT(argc, argv, "+:hVf", longopts)) != -1) {
    switch (c) {
    case CLI_OPT_HELP: fputs(cli_submit_usage, stdout); return 0;
    case CLI_OPT_VERSION: return cli_print_version();
    case OPT_DETACH: detach = true; break;
    case OPT_FOLLOW: follow = true; break;
    case OPT_IN_PROCESS: in_process = true; break;
    case OPT_MASTER: master = optarg; break;
    case OPT_STATUS:
    case OPT_LOGS:
    case OPT_KILL: {
      const char *what = c == OPT_STATUS ? "status" : c == OPT_LOGS ? "logs" : "kill";
      if (watch) return cli_usage_error("submit", "--%s and --%s: one at a time", watch, what);
      watch = what;
      if (!cli_parse_u64(optarg, UINT64_MAX, &watch_id) || watch_id == 0)
        return cli_usage_error("submit", "--%s '%s' is not a submission id (the number --detach printed)", what,
                               optarg);
      break;
    }
    case OPT_NAME:
      if (!*(name = optarg)) return cli_usage_error("submit", "--name needs a non-empty name");
      break;
    case OPT_MEMORY:
      if (!cli_parse_memory(optarg, &opts.memory_limit))
        return cli_usage_error("submit", "--memory '%s' is not a size (examples: 512m, 1.5g, 2048 for 2 GiB)",
                               optarg);
      break;
    default: return cli_option_error("submit", c, argv - 1, longopts);
    }
  }
  int i = optind - 1; /* getopt counted the command's name */
  if (follow && (!watch || strcmp(watch, "logs") != 0))
    return cli_usage_error("submit", "--follow (-f) goes with --logs ID");
  if (watch) {
    if (i < argc) return cli_usage_error("submit", "--%s ID takes no job library ('%s')", watch, argv[i]);
    if (detach || name || in_process || opts.memory_limit)
      return cli_usage_error("submit", "--%s ID takes only --master%s", watch,
                             strcmp(watch, "logs") == 0 ? " and --follow" : "");
    return watch_submission(watch, master, watch_id, follow);
  }
  if (i >= argc) return cli_usage_error("submit", "no job library given");
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
      return cli_failure("submit", "%s", fl_last_error());
    }
    if (detach) printf("submitted job binary %llu\n", (unsigned long long)id);
    return detach ? 0 : code;
  }
  if (detach) return cli_usage_error("submit", "--detach needs a flint://HOST:PORT master");
  /* Run by a driver, the job's stdout is a pipe to it, which C buffers in blocks: the job's
   * lines would reach its submitter only at its end, and not at all if the driver died
   * first. Line by line, as on a terminal. */
  if (in_process) setvbuf(stdout, NULL, _IOLBF, 0);
  /* dlopen searches the library path for a bare name; a job is a file, so make it a path. */
  char path[4096];
  snprintf(path, sizeof path, "%s%s", strchr(job, '/') ? "" : "./", job);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    return cli_failure("submit", "cannot load job %s: %s", job, dlerror());
  }
  fl_main_fn main_fn;
  *(void **)&main_fn = dlsym(lib, FL_MAIN_SYMBOL);
  if (!main_fn) {
    cli_error("submit", "%s does not export %s(fl_context *, int, char **)", job, FL_MAIN_SYMBOL);
    dlclose(lib);
    return 1;
  }
  fl_context *ctx;
  if (fl_context_open(master, &opts, &ctx) != FL_OK) {
    cli_error("submit", "%s", fl_last_error());
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
  enum { OPT_LISTEN = 256, OPT_WORK_DIR, OPT_PORT_FILE };
  static const struct option longopts[] = {{"listen", required_argument, NULL, OPT_LISTEN},
                                           {"work-dir", required_argument, NULL, OPT_WORK_DIR},
                                           {"port-file", required_argument, NULL, OPT_PORT_FILE},
                                           CLI_COMMON_LONG_OPTIONS,
                                           {0}};
  fl_driver_options o = {0};
  int c;
  optind = 0;
  while ((c = GETOPT(argc, argv, ":hV", longopts)) != -1) {
    switch (c) {
    case CLI_OPT_HELP: fputs(cli_driver_usage, stdout); return 0;
    case CLI_OPT_VERSION: return cli_print_version();
    case OPT_LISTEN: o.listen = optarg; break;
    case OPT_WORK_DIR: o.work_dir = optarg; break;
    case OPT_PORT_FILE: o.port_file = optarg; break;
    default: return cli_option_error("driver", c, argv - 1, longopts);
    }
  }
  if (optind - 1 < argc) return cli_usage_error("driver", "unexpected argument '%s'", argv[optind - 1]);
  if (!o.listen) return cli_usage_error("driver", "--listen HOST:PORT is required");
  handle_stop_signals();
  fl_status st = fl_driver_serve(&o, &stop_requested);
  if (st != FL_OK) cli_error("driver", "%s", fl_last_error());
  leave_local_cluster(o.port_file);
  return st == FL_OK ? 0 : 1;
}

int cmd_history(int argc, char **argv) {
  enum { OPT_DIR = 256, OPT_LISTEN, OPT_PORT_FILE };
  static const struct option longopts[] = {{"dir", required_argument, NULL, OPT_DIR},
                                           {"listen", required_argument, NULL, OPT_LISTEN},
                                           {"port-file", required_argument, NULL, OPT_PORT_FILE},
                                           CLI_COMMON_LONG_OPTIONS,
                                           {0}};
  fl_history_options o = {0};
  int c;
  optind = 0;
  while ((c = GETOPT(argc, argv, ":hV", longopts)) != -1) {
    switch (c) {
    case CLI_OPT_HELP: fputs(cli_history_usage, stdout); return 0;
    case CLI_OPT_VERSION: return cli_print_version();
    case OPT_DIR: o.dir = optarg; break;
    case OPT_LISTEN: o.listen = optarg; break;
    case OPT_PORT_FILE: o.port_file = optarg; break;
    default: return cli_option_error("history", c, argv - 1, longopts);
    }
  }
  if (optind - 1 < argc) return cli_usage_error("history", "unexpected argument '%s'", argv[optind - 1]);
  if (!o.dir) return cli_usage_error("history", "--dir DIR is required (the drivers' FLINT_EVENT_LOG_DIR)");
  handle_stop_signals();
  fl_status st = fl_history_serve(&o, &stop_requested);
  if (st != FL_OK) cli_error("history", "%s", fl_last_error());
  return st == FL_OK ? 0 : 1;
}

int cmd_executor(int argc, char **argv, char **whole) {
  enum { OPT_DRIVER = 256, OPT_CORES, OPT_MEMORY, OPT_WORK_DIR, OPT_HOST, OPT_GPU };
  static const struct option longopts[] = {{"driver", required_argument, NULL, OPT_DRIVER},
                                           {"cores", required_argument, NULL, OPT_CORES},
                                           {"memory", required_argument, NULL, OPT_MEMORY},
                                           {"work-dir", required_argument, NULL, OPT_WORK_DIR},
                                           {"host", required_argument, NULL, OPT_HOST},
                                           {"gpu", required_argument, NULL, OPT_GPU},
                                           CLI_COMMON_LONG_OPTIONS,
                                           {0}};
  fl_executor_options o = {0};
  const char *cores = NULL, *memory = NULL, *gpu = NULL;
  int c;
  optind = 0;
  /* "+": no permuting, so that `whole`, which the supervised child runs again, stays as given. */
  while ((c = GETOPT(argc, argv, "+:hV", longopts)) != -1) {
    switch (c) {
    case CLI_OPT_HELP: fputs(cli_executor_usage, stdout); return 0;
    case CLI_OPT_VERSION: return cli_print_version();
    case OPT_DRIVER: o.driver = optarg; break;
    case OPT_CORES: cores = optarg; break;
    case OPT_MEMORY: memory = optarg; break;
    case OPT_WORK_DIR: o.work_dir = optarg; break;
    case OPT_HOST: o.host = optarg; break;
    case OPT_GPU: gpu = optarg; break;
    default: return cli_option_error("executor", c, argv - 1, longopts);
    }
  }
  if (optind - 1 < argc) return cli_usage_error("executor", "unexpected argument '%s'", argv[optind - 1]);
  if (!o.driver) return cli_usage_error("executor", "--driver HOST:PORT is required");
  if (!cores) return cli_usage_error("executor", "--cores N is required");
  if (!memory) return cli_usage_error("executor", "--memory SIZE is required");
  if (!cli_parse_u32(cores, &o.cores) || o.cores < 1 || o.cores > 1024)
    return cli_usage_error("executor", "--cores '%s' must be 1 to 1024", cores);
  if (gpu) {
    if (!cli_parse_u32(gpu, &o.gpu) || o.gpu > 1023)
      return cli_usage_error("executor", "--gpu '%s' must be a GPU id, 0 to 1023", gpu);
    o.has_gpu = true;
  }
  if (!cli_parse_memory(memory, &o.memory) || o.memory < (1u << 20))
    return cli_usage_error("executor", "--memory '%s' is not a size of at least 1m (examples: 512m, 1.5g, 2048 for 2 GiB)",
                           memory);
  handle_stop_signals();
  /* `flint executor` supervises: the executor itself runs in a child (this command again,
   * marked by FLINT_EXECUTOR_REPORT_FD), which a crashing task takes down alone. */
  if (!config_string(CONFIG_EXECUTOR_REPORT_FD) && config_bool(CONFIG_EXECUTOR_SUPERVISE)) {
    int rc = fl_executor_supervise(whole, &stop_requested);
    leave_local_cluster(NULL); /* after a child that could not */
    return rc;
  }
  fl_status st = fl_executor_serve(&o, &stop_requested);
  if (st != FL_OK) cli_error("executor", "%s", fl_last_error());
  leave_local_cluster(NULL);
  return st == FL_OK ? 0 : 1;
}

int cmd_status(int argc, char **argv) {
  enum { OPT_MASTER = 256 };
  static const struct option longopts[] = {
      {"master", required_argument, NULL, OPT_MASTER}, CLI_COMMON_LONG_OPTIONS, {0}};
  const char *master = NULL;
  int c;
  optind = 0;
  while ((c = GETOPT(argc, argv, ":hV", longopts)) != -1) {
    switch (c) {
    case CLI_OPT_HELP: fputs(cli_status_usage, stdout); return 0;
    case CLI_OPT_VERSION: return cli_print_version();
    case OPT_MASTER: master = optarg; break;
    default: return cli_option_error("status", c, argv - 1, longopts);
    }
  }
  if (optind - 1 < argc) return cli_usage_error("status", "unexpected argument '%s'", argv[optind - 1]);
  if (!master) return cli_usage_error("status", "--master flint://HOST:PORT is required");
  if (fl_print_status(master, stdout) != FL_OK) return cli_failure("status", "%s", fl_last_error());
  return 0;
}
