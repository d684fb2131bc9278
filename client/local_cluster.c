/*
 * local_cluster.c: local-cluster[E,C,MB] starts a driver and E executors as child processes
 * of this one on 127.0.0.1 and stops them on close; they also end when this process dies
 * (PDEATHSIG).
 *
 * Each child leads a process group of its own: a terminal sends Ctrl-C's SIGINT (and Ctrl-Z's,
 * Ctrl-\'s) to its whole foreground group, which the program that opened the context (the
 * shell, which takes Ctrl-C as "stop this input") may handle; the cluster's processes must
 * not stop with them. Their end is tied to this process by PDEATHSIG, not by the terminal.
 *
 * Their folders are in one folder of the cluster, which close removes. A program that dies
 * instead (SIGTERM, SIGKILL, a crash) cannot remove it, and a signal handler of ours would
 * not do: the program may have its own, SIGKILL has none, and a handler may not remove a
 * tree. So the children remove it: each gets its path (FLINT_LOCAL_CLUSTER_DIR) and, as it
 * ends, after removing its own folder, tries rmdir() on it, which only succeeds once the
 * folder is empty, so the last one out removes it, whatever the order. The driver's port
 * file is removed as soon as it is read, so that nothing else stays in the folder.
 *
 * Threading: called only by the thread that opens or closes the context.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "common/config.h"
#include "flint/cluster.h"

#define START_TIMEOUT_MS 30000

/* The flint command next to this library (or the one FLINT_EXECUTABLE names). */
static fl_status flint_executable(char *out, size_t len) {
  const char *env = config_string(CONFIG_EXECUTABLE);
  if (env) {
    snprintf(out, len, "%s", env);
    return access(out, X_OK) == 0 ? FL_OK : FL_ERR(FL_ENOENT, "FLINT_EXECUTABLE=%s is not executable", env);
  }
  Dl_info info;
  char dir[PATH_MAX - 32];
  if (dladdr((void *)flint_executable, &info) && info.dli_fname) { /* this library's file */
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
#ifndef FLINT_LIB_TO_BIN
#define FLINT_LIB_TO_BIN "../bin"
#endif
    /* The build tree (bin/ beside lib/) and an installed tree, whose lib folder may be
     * deeper (lib/x86_64-linux-gnu): CMake gives the way from it to the bin folder. */
    const char *tries[] = {"%s/flint", "%s/../bin/flint", "%s/" FLINT_LIB_TO_BIN "/flint"};
    for (int i = 0; i < 3; i++) {
      snprintf(out, len, tries[i], dir);
      if (access(out, X_OK) == 0) return FL_OK;
    }
  }
  const char *bin = config_string(CONFIG_BIN);
  if (bin) {
    snprintf(out, len, "%s/flint", bin);
    if (access(out, X_OK) == 0) return FL_OK;
  }
  return FL_ERR(FL_ENOENT, "cannot find the flint command to start a local cluster: set FLINT_EXECUTABLE");
}

/* envp: made before the fork, as the child of a threaded program may not allocate. */
static pid_t spawn(char *const argv[], char *const envp[]) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* End with the program that started the cluster, also when it exits on an error. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    setpgid(0, 0); /* out of the terminal's foreground group (see the top) */
    execve(argv[0], argv, envp);
    _exit(127);
  }
  /* Both sides set it, so that it holds before either goes on (the call fails harmlessly
   * with EACCES once the child has exec'd). */
  if (pid > 0) setpgid(pid, pid);
  return pid;
}

/* This process's environment with FLINT_LOCAL_CLUSTER_DIR=dir, for the children; NULL when
 * out of memory. Free with free_environment. */
static char **cluster_environment(const char *dir) {
  const char *name = config_setting_of(CONFIG_LOCAL_CLUSTER_DIR)->name;
  size_t n = 0, prefix = strlen(name) + 1;
  while (environ[n]) n++;
  char **env = common_calloc(n + 2, sizeof *env);
  size_t len = prefix + strlen(dir) + 1;
  char *mine = common_malloc(len);
  if (!env || !mine) {
    common_free(env);
    common_free(mine);
    return NULL;
  }
  snprintf(mine, len, "%s=%s", name, dir);
  size_t k = 0;
  env[k++] = mine;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], name, prefix - 1) != 0 || environ[i][prefix - 1] != '=') env[k++] = environ[i];
  return env;
}

static void free_environment(char **env) {
  if (env) common_free(env[0]);
  common_free(env);
}

/* The driver (children[0]) goes first, so that it sends nothing more to executors that are
 * stopping; then the executors, together. */
static void stop_children(client_local_cluster *lc) {
  uint64_t deadline = common_now_ns() + 10000000000ull;
  for (uint32_t i = 0; i < lc->num_children; i++) {
    if (i <= 1)
      for (uint32_t j = i; j < (i == 0 ? 1 : lc->num_children); j++)
        if (lc->children[j] > 0) kill(lc->children[j], SIGTERM);
    if (lc->children[i] <= 0) continue;
    for (;;) {
      pid_t r = waitpid(lc->children[i], NULL, WNOHANG);
      if (r == lc->children[i] || (r < 0 && errno != EINTR)) break;
      if (common_now_ns() > deadline) {
        kill(lc->children[i], SIGKILL);
        waitpid(lc->children[i], NULL, 0);
        break;
      }
      usleep(5000);
    }
    lc->children[i] = 0;
  }
}

static fl_status parse_local_cluster(const char *master, uint32_t *e, uint32_t *cores, uint32_t *mb) {
  unsigned long a, b, m;
  char close_bracket, extra;
  if (sscanf(master, "local-cluster[%lu,%lu,%lu%c%c", &a, &b, &m, &close_bracket, &extra) != 4 ||
      close_bracket != ']')
    return FL_ERR(FL_EINVAL, "master '%s': expected local-cluster[EXECUTORS,CORES,MEGABYTES]", master);
  if (a < 1 || a > 64 || b < 1 || b > 1024 || m < 16 || m > (1ul << 22))
    return FL_ERR(FL_EINVAL,
                  "master '%s': 1 to 64 executors, 1 to 1024 cores each and 16 to 4194304 MB each",
                  master);
  *e = (uint32_t)a;
  *cores = (uint32_t)b;
  *mb = (uint32_t)m;
  return FL_OK;
}

fl_status client_local_cluster_start(client_local_cluster *lc, const char *master, char *addr, size_t len,
                                     uint32_t *executors) {
  uint32_t n = 0, cores = 0, mb = 0;
  fl_status st = parse_local_cluster(master, &n, &cores, &mb);
  if (st != FL_OK) return st;
  char exe[PATH_MAX];
  if ((st = flint_executable(exe, sizeof exe)) != FL_OK) return st;
  const char *base = client_work_base(NULL);
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/flint-cluster-XXXXXX", base);
  if (!mkdtemp(dir)) return FL_ERR(FL_EIO, "cannot create a folder in %s: %s", base, strerror(errno));
  if (!(lc->dir = common_strdup(dir))) return FL_ERR(FL_ENOMEM, "out of memory");
  if (!(lc->children = common_calloc(n + 1, sizeof *lc->children))) return FL_ERR(FL_ENOMEM, "out of memory");
  char port_file[PATH_MAX + 16];
  snprintf(port_file, sizeof port_file, "%s/driver.port", dir);
  char **env = cluster_environment(dir);
  if (!env) return FL_ERR(FL_ENOMEM, "out of memory");
  char *dargv[] = {exe, "driver", "--listen", "127.0.0.1:0", "--port-file", port_file, "--work-dir", dir, NULL};
  if ((lc->children[lc->num_children++] = spawn(dargv, env)) < 0) {
    free_environment(env);
    return FL_ERR(FL_EIO, "cannot start the driver: %s", strerror(errno));
  }
  uint64_t deadline = common_now_ns() + (uint64_t)START_TIMEOUT_MS * 1000000u;
  int port = 0;
  while (!port) {
    FILE *f = fopen(port_file, "r");
    if (f) {
      if (fscanf(f, "%d", &port) != 1) port = 0;
      fclose(f);
    }
    if (port) break;
    if (waitpid(lc->children[0], NULL, WNOHANG) == lc->children[0]) {
      lc->children[0] = 0;
      free_environment(env);
      return FL_ERR(FL_EIO, "the local cluster's driver exited at start (its log is above)");
    }
    if (common_now_ns() > deadline) {
      free_environment(env);
      return FL_ERR(FL_ETIMEDOUT, "the local cluster's driver did not start");
    }
    usleep(5000);
  }
  unlink(port_file); /* read: the folder keeps only the children's own (see the top) */
  snprintf(addr, len, "127.0.0.1:%d", port);
  char cores_s[16], mem_s[32];
  snprintf(cores_s, sizeof cores_s, "%u", cores);
  snprintf(mem_s, sizeof mem_s, "%um", mb);
  /* FLINT_LOCAL_CLUSTER_GPUS=G (flint.h): the first G executors get --gpu 0 .. G-1. */
  uint64_t gpus = config_check(CONFIG_LOCAL_CLUSTER_GPUS) == FL_OK ? config_count(CONFIG_LOCAL_CLUSTER_GPUS) : UINT64_MAX;
  if (gpus > n) {
    free_environment(env);
    return FL_ERR(FL_EINVAL, "FLINT_LOCAL_CLUSTER_GPUS=%s: a number of at most %u executors",
                  config_text(CONFIG_LOCAL_CLUSTER_GPUS), n);
  }
  for (uint32_t i = 0; i < n; i++) {
    char gpu_s[16];
    snprintf(gpu_s, sizeof gpu_s, "%u", i);
    char *eargv[] = {exe, "executor", "--driver", addr, "--cores", cores_s, "--memory", mem_s,
                     "--work-dir", dir, i < gpus ? "--gpu" : NULL, gpu_s, NULL};
    if ((lc->children[lc->num_children++] = spawn(eargv, env)) < 0) {
      free_environment(env);
      return FL_ERR(FL_EIO, "cannot start an executor: %s", strerror(errno));
    }
  }
  free_environment(env);
  *executors = n;
  return FL_OK;
}

fl_status client_local_cluster_wait(client_local_cluster *lc, rpc_channel *driver, uint32_t want) {
  uint64_t deadline = common_now_ns() + (uint64_t)START_TIMEOUT_MS * 1000000u;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = FL_OK;
  for (;;) {
    Flint__Empty req = FLINT__EMPTY__INIT;
    if ((st = client_rpc_call(driver, "/flint.Driver/Status", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply)) != FL_OK)
      break;
    Flint__StatusReply *r = flint__status_reply__unpack(NULL, reply.len, reply.data);
    size_t have = r ? r->n_executors : 0;
    if (r) flint__status_reply__free_unpacked(r, NULL);
    if (have >= want) break;
    for (uint32_t i = 1; i < lc->num_children; i++)
      if (lc->children[i] > 0 && waitpid(lc->children[i], NULL, WNOHANG) == lc->children[i]) {
        lc->children[i] = 0;
        st = FL_ERR(FL_EIO, "an executor of the local cluster exited at start (its log is above)");
      }
    if (st != FL_OK) break;
    if (common_now_ns() > deadline) {
      st = FL_ERR(FL_ETIMEDOUT, "only %zu of %u executors registered in %d s", have, want,
                  START_TIMEOUT_MS / 1000);
      break;
    }
    usleep(5000);
  }
  fl_buf_free(&reply);
  return st;
}

void client_local_cluster_stop(client_local_cluster *lc) {
  if (lc->num_children) stop_children(lc);
  if (lc->dir) common_remove_tree(lc->dir);
  common_free(lc->dir);
  common_free(lc->children);
  lc->dir = NULL;
  lc->children = NULL;
  lc->num_children = 0;
}
