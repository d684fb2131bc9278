/*
 * driver.h: the driver process (`flint driver`) as the rest of flint sees it: serving as
 * the driver (client/serve.c, for cli/), the limits of the calls between clients and the
 * driver, and the scheduler that local contexts run (driver/scheduler/scheduler.h).
 * What the driver process is made of is driver_internal.h; its scheduler is
 * driver/scheduler/ (scheduler.h), below the rest of driver/.
 */
#ifndef FLINT_DRIVER_H
#define FLINT_DRIVER_H

#include <signal.h>

#include "driver/scheduler/scheduler.h"
/* The driver process runs on the executor's task pool and the control plane (client/ reaches
 * both through this header too). */
#include "executor/executor.h"
#include "net/net.h"

/* The largest call to or from the driver: a barrier stage's checkpoint (the largest thing a
 * call carries) and 1 MiB for the rest of its message. Libraries and plans are smaller; job
 * results come in chunks of at most DRIVER_RESULT_CHUNK. */
#define DRIVER_MAX_MESSAGE (RDD_BARRIER_CHECKPOINT_MAX + ((size_t)1 << 20))
/* Broadcasts up to BROADCAST_INLINE_MAX bytes travel with the jobs (InlineBroadcast in
 * flint.proto), while an application's live ones total at most BROADCAST_INLINE_TOTAL; the
 * others are fetched by the executors from the client. Small parameter vectors (an L-BFGS
 * iteration's weights) so cost no call of their own. */
#define BROADCAST_INLINE_MAX ((size_t)64 << 10)
#define BROADCAST_INLINE_TOTAL ((size_t)4 << 20)

typedef struct driver_config {
  const char *listen;    /* HOST:PORT; port 0 picks one */
  const char *secret;    /* NULL: none */
  const char *work_dir;  /* NULL: $TMPDIR or /tmp */
  const char *port_file; /* when set, the chosen port is written there once listening */
} driver_config;

/* One BlockUpdated event (docs/ui.md) for web UI `u` (NULL: nothing), as the driver posts
 * its executors' reports and a local context its own block manager's changes: block
 * (rdd_id, partition) of application `app` on executor `executor` (0: a local context's)
 * holds `memory` and `disk` bytes now (both 0: gone). `name` (NULL: unknown) and `partitions`
 * (0: unknown) describe its dataset. Any thread; never blocks (ui_post). */
struct ui;
FL_INTERNAL void driver_ui_block(struct ui *u, uint64_t app, uint64_t executor, uint64_t rdd_id, uint32_t partition,
                                 fl_storage_level level, uint64_t memory, uint64_t disk, const char *name,
                                 uint32_t partitions);

/* Serves as the driver until *stop becomes nonzero. Blocks. */
FL_INTERNAL fl_status driver_serve(const driver_config *cfg, volatile sig_atomic_t *stop);

#endif /* FLINT_DRIVER_H */
