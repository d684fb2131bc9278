/*
 * gpu/parallel/train_rank.c: what the trainers' barrier tasks share
 * (gpu/parallel/train_rank.h): opening the rank's device, joining the stage's ranks into one
 * communicator through the barrier (host backend or NCCL), agreeing on a count, and the
 * evaluation loop over the ranks' common test share.
 *
 * Threading: every call runs on the rank's task thread; the collective ones block until every
 * rank of the stage has made the same call.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"
#include "gpu/comm/comm.h"
#include "gpu/parallel/train_rank.h"

bool train_uses_nccl(fl_device_kind kind) {
  return kind == FL_DEVICE_CUDA && strcmp(config_string(CONFIG_TRAIN_COMM), "host") != 0;
}

uint32_t train_allreduce_bit(const fl_comm *comm, fl_allreduce_algo algo, size_t bytes) {
  if (!comm) return 0;
  if (strcmp(fl_comm_backend(comm), "nccl") == 0) return TRAIN_ALLREDUCE_NCCL;
  (void)algo; /* the communicator's own, set by train_connect */
  return 1u << (unsigned)comm_pick_algo(comm, bytes);
}

/* Whether two ranks of the barrier train on one GPU (the same host and PCI address), which
 * NCCL refuses: then every rank takes the host backend. All ranks see the same gathered
 * records, so they all decide alike. */
static fl_status ranks_share_a_gpu(fl_barrier *b, const fl_device *dev, bool *out) {
  char mine[320], host[256] = "";
  gethostname(host, sizeof host - 1);
  int len = snprintf(mine, sizeof mine, "%s/%s", host, dev->pci_bus_id);
  fl_records *all = NULL;
  fl_status status = fl_barrier_all_gather(b, fl_bytes_of(mine, (size_t)len), 0, &all);
  if (status != FL_OK) return status;
  *out = false;
  size_t n = fl_records_count(all);
  for (size_t i = 0; i < n && !*out; i++)
    for (size_t j = i + 1; j < n && !*out; j++) {
      fl_bytes x = fl_records_get(all, i), y = fl_records_get(all, j);
      *out = x.len == y.len && memcmp(x.data, y.data, x.len) == 0;
    }
  fl_records_free(all);
  return FL_OK;
}

fl_status train_connect(fl_barrier *b, fl_device *dev, fl_device_kind kind, fl_allreduce_algo algo, bool host,
                        int comm_rank, fl_comm **out) {
  uint32_t world = fl_barrier_world(b);
  uint32_t rank = comm_rank >= 0 ? (uint32_t)comm_rank : fl_barrier_rank(b);
  fl_status status = FL_OK;
  fl_records *all = NULL;
  fl_comm_endpoint *ep = NULL;
  const char **addrs = NULL;
  *out = NULL;
  bool shared = false;
  if (!host && train_uses_nccl(kind)) FL_CHECK(ranks_share_a_gpu(b, dev, &shared));
  if (!host && !shared && train_uses_nccl(kind)) {
    uint8_t id[FL_NCCL_ID_BYTES] = {0};
    bool first = fl_barrier_rank(b) == 0; /* any one rank makes the id */
    if (first) FL_CHECK(fl_comm_nccl_unique_id(id));
    FL_CHECK(fl_barrier_all_gather(b, fl_bytes_of(id, first ? sizeof id : 0), 0, &all));
    fl_bytes root = fl_records_get(all, 0);
    if (root.len != FL_NCCL_ID_BYTES) {
      status = fl_set_error(FL_EPROTO, "rank 0 sent a NCCL id of %zu bytes", root.len);
      goto cleanup;
    }
    memcpy(id, root.data, sizeof id);
    FL_CHECK(fl_comm_nccl_create(dev, (int)rank, (int)world, id, out));
  } else {
    /* FLINT_COMM_HOST: the address other ranks reach this one at (cluster mode across
     * hosts); loopback by default. */
    FL_CHECK(fl_comm_listen(config_string(CONFIG_COMM_HOST), &ep));
    /* Each rank sends its communicator rank and its address, NUL-terminated. */
    const char *where_me = fl_comm_endpoint_address(ep);
    char mine[256];
    size_t len = strlen(where_me) + 1;
    if (len > sizeof mine - 4) FL_CHECK(fl_set_error(FL_EINVAL, "address '%s' is too long", where_me));
    memcpy(mine, &rank, 4);
    memcpy(mine + 4, where_me, len);
    FL_CHECK(fl_barrier_all_gather(b, fl_bytes_of(mine, 4 + len), 0, &all));
    addrs = common_calloc(world, sizeof *addrs);
    if (!addrs) {
      status = fl_set_error(FL_ENOMEM, "rank %u: out of memory", rank);
      goto cleanup;
    }
    for (uint32_t i = 0; i < world; i++) {
      fl_bytes rec = fl_records_get(all, i);
      uint32_t at = world;
      if (rec.len >= 5) memcpy(&at, rec.data, 4);
      if (rec.len < 5 || rec.data[rec.len - 1] != '\0' || at >= world || addrs[at]) {
        status = fl_set_error(FL_EPROTO, "task %u sent a malformed address or a rank taken twice", i);
        goto cleanup;
      }
      addrs[at] = (const char *)rec.data + 4;
    }
    fl_comm_endpoint *take = ep;
    ep = NULL; /* fl_comm_host_create takes it, on failure too */
    FL_CHECK(fl_comm_host_create(take, (int)rank, (int)world, addrs, 0, out));
    FL_CHECK(fl_comm_set_allreduce_algo(*out, algo));
  }
cleanup:
  if (status != FL_OK) {
    fl_comm_destroy(*out);
    *out = NULL;
  }
  common_free(addrs);
  fl_comm_endpoint_destroy(ep);
  fl_records_free(all);
  return status;
}

fl_status train_device_open(fl_barrier *b, fl_device_kind kind, fl_precision precision, fl_device **out) {
  int ordinal = 0;
  if (kind == FL_DEVICE_CUDA) {
    int gpus = fl_cuda_device_count();
    ordinal = fl_barrier_gpu(b) >= 0 ? fl_barrier_gpu(b) : gpus > 0 ? (int)(fl_barrier_rank(b) % (uint32_t)gpus) : 0;
  }
  fl_device *dev = NULL;
  fl_status s = fl_device_open(kind, ordinal, &dev);
  if (s == FL_OK) s = fl_device_set_precision(dev, precision);
  if (s != FL_OK) {
    fl_device_close(dev);
    return s;
  }
  *out = dev;
  return FL_OK;
}

double train_slowdown_of(uint32_t rank) {
  const char *v = config_string(CONFIG_PS_SLOW_WORKER);
  unsigned k;
  double f;
  char extra;
  if (!v || !*v || strcmp(v, "none") == 0) return 1;
  if (sscanf(v, "%u:%lf%c", &k, &f, &extra) != 2 || !(f >= 1 && f <= 1000)) {
    common_log(LOG_WARN, "FLINT_PS_SLOW_WORKER=%s is not K:F (F from 1 to 1000): ignored", v);
    return 1;
  }
  return k == rank ? f : 1;
}

void train_straggle(double factor, double since) {
  if (!(factor > 1)) return;
  double extra = (common_now_s() - since) * (factor - 1);
  struct timespec ts = {(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

fl_status train_agree_min(fl_barrier *b, uint64_t mine, uint64_t *out) {
  uint32_t world = fl_barrier_world(b);
  if (world == 1) {
    *out = mine;
    return FL_OK;
  }
  fl_records *all = NULL;
  fl_status s = fl_barrier_all_gather(b, fl_bytes_of(&mine, sizeof mine), 0, &all);
  if (s != FL_OK) return s;
  uint64_t m = mine;
  for (uint32_t i = 0; i < world; i++) {
    fl_bytes rec = fl_records_get(all, i);
    uint64_t v;
    if (rec.len != sizeof v) {
      fl_records_free(all);
      return fl_set_error(FL_EPROTO, "rank %u sent a count of %zu bytes", i, rec.len);
    }
    memcpy(&v, rec.data, sizeof v);
    if (v < m) m = v;
  }
  fl_records_free(all);
  *out = m;
  return FL_OK;
}

fl_status train_evaluate_share(fl_barrier *b, data_reader *test, uint64_t seed, uint32_t epoch, float *images,
                               int32_t *labels, uint32_t units, train_eval_batch_fn batch, void *user, double *loss,
                               double *acc) {
  fl_status status = FL_OK;
  uint64_t share = 0, done = 0;
  double loss_sum = 0, correct = 0;
  FL_CHECK(train_agree_min(b, data_reader_images(test), &share));
  data_reader_start_epoch(test, seed, epoch, false, 0, true);
  while (done < share) {
    uint32_t n = data_reader_next(test, images, labels);
    if (n == 0) FL_CHECK(fl_set_error(FL_EINTERNAL, "rank %u: its test share ended early", fl_barrier_rank(b)));
    if (done + n > share) n = (uint32_t)(share - done);
    double ls, c;
    FL_CHECK(batch(user, n, &ls, &c));
    loss_sum += ls;
    correct += c;
    done += n;
  }
  double predicted = (double)share * fl_barrier_world(b) * units;
  *loss = predicted > 0 ? loss_sum / predicted : NAN;
  *acc = predicted > 0 ? correct / predicted : NAN;
cleanup:
  return status;
}
