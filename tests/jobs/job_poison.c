/*
 * job_poison: a job binary for test_cluster_faults whose map function kills the process
 * that runs it on one partition: a poison task, as a user's bug makes one.
 *
 *   flint submit --master MASTER job_poison.so segv|abort|exit PARTITION
 *
 * 4 partitions of range(0, 400); partition PARTITION dies by SIGSEGV, by abort() or by
 * exit(7). Output: "count N" when the job succeeds; else flint's message on stderr and exit
 * status 1.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "flint/flint.h"

#define JOB_EXPORT __attribute__((visibility("default")))

typedef struct poison {
  char mode[8];
  uint32_t partition;
} poison;

/* A real fault, which the sanitizer builds must not turn into their own report and exit. */
__attribute__((no_sanitize("undefined"), no_sanitize_address)) static void jp_store_nowhere(void) {
  volatile int *volatile nowhere = NULL; /* both volatile: neither read nor store may go */
  *nowhere = 1; /* SIGSEGV */
}

JOB_EXPORT fl_status jp_poison(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  poison p;
  memcpy(&p, arg, sizeof p);
  if (partition == p.partition) {
    struct rlimit no_core = {0, 0}; /* no core file: slow, and litter */
    setrlimit(RLIMIT_CORE, &no_core);
    if (strcmp(p.mode, "exit") == 0) exit(7);
    if (strcmp(p.mode, "abort") == 0) abort();
    jp_store_nowhere();
  }
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &rec)) s = fl_emit(out, rec.data, rec.len);
  return s;
}

JOB_EXPORT int flint_main(fl_context *ctx, int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: job_poison.so segv|abort|exit PARTITION\n");
    return 2;
  }
  poison p = {.partition = (uint32_t)atoi(argv[2])};
  snprintf(p.mode, sizeof p.mode, "%s", argv[1]);
  fl_dataset *src = NULL, *mapped = NULL;
  uint64_t n = 0;
  int rc = 1;
  if (fl_range(ctx, 0, 400, 1, 4, &src) != FL_OK ||
      fl_map_partitions(src, jp_poison, &p, sizeof p, &mapped) != FL_OK || fl_count(mapped, &n) != FL_OK) {
    fprintf(stderr, "job_poison: %s\n", fl_last_error());
  } else {
    printf("count %llu\n", (unsigned long long)n);
    rc = 0;
  }
  fl_dataset_free(mapped);
  fl_dataset_free(src);
  return rc;
}
