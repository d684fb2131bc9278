/*
 * flint.c: the flint command. For now: `flint submit --master local[N] job.so [args...]`,
 * which runs a job binary in this process, plus --help and --version.
 *
 * Exit status: the job's own status; 2 for a usage error; 1 when the job could not be
 * started (missing library, missing flint_main, bad master).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flint/flint.h"

static const char usage_text[] =
    "usage: flint <command> [options]\n"
    "\n"
    "commands:\n"
    "  submit [--master MASTER] [--memory SIZE] JOB.so [ARGS...]\n"
    "      Runs a job binary: a shared library exporting\n"
    "      int flint_main(fl_context *ctx, int argc, char **argv).\n"
    "      MASTER: local, local[N] or local[*] (default local[*]).\n"
    "      SIZE: memory for cached blocks, e.g. 512m or 2g (default 1g).\n"
    "\n"
    "options:\n"
    "  --help     this text\n"
    "  --version  the version\n";

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "flint: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nRun 'flint --help' for usage.\n");
  return 2;
}

static int cmd_submit(int argc, char **argv) {
  const char *master = "local[*]";
  fl_options opts = FL_OPTIONS_INIT;
  int i = 0;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--master") == 0 || strcmp(argv[i], "--memory") == 0) {
      if (i + 1 >= argc) return usage_error("%s needs a value", argv[i]);
      if (strcmp(argv[i], "--master") == 0) {
        master = argv[++i];
      } else if (fl_parse_size(argv[++i], &opts.memory_limit) != FL_OK || opts.memory_limit == 0) {
        return usage_error("--memory '%s' is not a size (examples: 512m, 2g)", argv[i]);
      }
      continue;
    }
    return usage_error("submit: unknown option '%s'", argv[i]);
  }
  if (i >= argc) return usage_error("submit: %s", "no job library given");

  const char *job = argv[i];
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
  return usage_error("unknown command '%s'", argv[1]);
}
