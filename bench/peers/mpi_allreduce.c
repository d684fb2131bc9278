/*
 * mpi_allreduce.c: Open MPI's allreduce timed as bench_allreduce times flint's, for its peer
 * rows. Started by bench_allreduce through mpirun (-np P, with the byte transport layer
 * chosen on mpirun's command line: vader, shared memory, or tcp over loopback):
 *
 *   mpi_allreduce LABEL BYTES:SAMPLES [BYTES:SAMPLES ...]
 *
 * For each size: one untimed allreduce, then SAMPLES samples of barrier + MPI_Allreduce
 * (in place, MPI_FLOAT, MPI_SUM) timed on every rank; a sample's time is the slowest rank's,
 * and rank 0 prints the median as one JSON line:
 *   {"peer": "openmpi", "transport": LABEL, "ranks": P, "bytes": B, "latency_us": T}
 * Exit 1 on a bad argument or an MPI failure (MPI aborts on its own errors).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SAMPLES 64

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 3) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce LABEL BYTES:SAMPLES ...\n");
    MPI_Finalize();
    return 1;
  }
  size_t max_bytes = 0;
  for (int i = 2; i < argc; i++) {
    size_t b = strtoull(argv[i], NULL, 10);
    if (b > max_bytes) max_bytes = b;
  }
  float *buf = calloc(max_bytes / sizeof(float) + 1, sizeof(float));
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int i = 2; i < argc; i++) {
    char *colon = strchr(argv[i], ':');
    size_t bytes = strtoull(argv[i], NULL, 10);
    int ns = colon ? atoi(colon + 1) : 0;
    if (!colon || bytes < sizeof(float) || ns < 1 || ns > MAX_SAMPLES) {
      if (rank == 0) fprintf(stderr, "mpi_allreduce: bad size '%s' (BYTES:SAMPLES)\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int n = (int)(bytes / sizeof(float));
    double t[MAX_SAMPLES], slowest[MAX_SAMPLES];
    MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int s = 0; s < ns; s++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t[s] = MPI_Wtime() - t0;
    }
    MPI_Reduce(t, slowest, ns, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      qsort(slowest, (size_t)ns, sizeof *slowest, cmp_double);
      double med = ns % 2 ? slowest[ns / 2] : 0.5 * (slowest[ns / 2 - 1] + slowest[ns / 2]);
      printf("{\"peer\": \"openmpi\", \"transport\": \"%s\", \"ranks\": %d, \"bytes\": %zu, "
             "\"latency_us\": %.2f}\n", argv[1], size, bytes, med * 1e6);
      fflush(stdout);
    }
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
