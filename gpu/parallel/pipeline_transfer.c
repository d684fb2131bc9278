/*
 * gpu/parallel/pipeline_transfer.c: the hybrid trainer's transfers between stages
 * (gpu/parallel/pipeline.h): sends go through the rank's own sender thread (a queue of
 * copies), so that they never block the schedule; a receive blocks, and keeps the messages that
 * arrive ahead of the one it waits for in a mailbox. Each message is a header (kind, stage,
 * micro-batch, floats) and the floats, over the pipeline group's host communicator. Also the
 * host buffers of the trainer's small collectives (pp_host_tensor, pp_world_sum).
 *
 * Threading: the sender thread and the rank's thread share the outbox, the pending count and
 * the first send failure under t->lock; the mailbox is the rank thread's.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/pipeline_internal.h"

static void message_free(message *m) {
  if (!m) return;
  common_free(m->data);
  common_free(m);
}

/* A host buffer as a tensor of the trainer's cpu device, for the host communicator. */
fl_tensor pp_host_tensor(pp_trainer *t, float *data, size_t count) {
  fl_tensor v = {.dev = &t->host, .ndim = 1, .numel = count, .data = data, .owns = false};
  v.shape[0] = (int64_t)count;
  return v;
}

fl_status pp_world_sum(pp_trainer *t, float *host, size_t count, fl_tensor *dev_buf) {
  if (strcmp(fl_comm_backend(t->world), "host") == 0) {
    fl_tensor sums = pp_host_tensor(t, host, count);
    return fl_comm_allreduce(t->world, &sums, FL_REDUCE_SUM);
  }
  fl_status status = FL_OK;
  int64_t shape[1] = {(int64_t)count};
  FL_CHECK(tensor_ensure(dev_buf, t->dev, 1, shape));
  FL_CHECK(t->dev->ops->from_host(t->dev, dev_buf->data, host, count * sizeof *host));
  FL_CHECK(fl_comm_allreduce(t->world, dev_buf, FL_REDUCE_SUM));
  FL_CHECK(t->dev->ops->to_host(t->dev, host, dev_buf->data, count * sizeof *host));
cleanup:
  return status;
}

static void *sender_main(void *arg) {
  pp_trainer *t = arg;
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (!t->out_head && !t->closing) pthread_cond_wait(&t->ready, &t->lock);
    message *m = t->out_head;
    if (m) {
      t->out_head = m->next;
      if (!t->out_head) t->out_tail = NULL;
    }
    bool failed = t->send_error != FL_OK;
    pthread_mutex_unlock(&t->lock);
    if (!m) break;
    if (!failed) {
      fl_tensor h = pp_host_tensor(t, m->header, MSG_HEADER_FLOATS), d = pp_host_tensor(t, m->data, m->count);
      fl_status s = fl_comm_send(t->pp, &h, m->peer);
      if (s == FL_OK && m->count) s = fl_comm_send(t->pp, &d, m->peer);
      if (s != FL_OK) {
        pthread_mutex_lock(&t->lock);
        if (t->send_error == FL_OK) {
          t->send_error = s;
          snprintf(t->send_msg, sizeof t->send_msg, "%s", fl_last_error());
        }
        pthread_mutex_unlock(&t->lock);
      }
    }
    message_free(m);
    pthread_mutex_lock(&t->lock);
    if (--t->pending == 0) pthread_cond_broadcast(&t->drained);
    pthread_mutex_unlock(&t->lock);
  }
  return NULL;
}

static fl_status sender_failure(pp_trainer *t) {
  pthread_mutex_lock(&t->lock);
  fl_status s = t->send_error;
  pthread_mutex_unlock(&t->lock);
  if (s == FL_OK) return FL_OK;
  return fl_set_error(s, "pipeline rank %d: sending to the next or previous stage failed: %s",
                      t->me.pp, t->send_msg);
}

fl_status pp_transfer_send(pp_trainer *t, int peer, int kind, int stage, int mb, const fl_tensor *y) {
  fl_status s = sender_failure(t);
  if (s != FL_OK) return s;
  message *m = common_calloc(1, sizeof *m);
  if (!m) return FL_ERR(FL_ENOMEM, "out of memory for a message");
  m->peer = peer;
  m->count = y->numel;
  m->header[0] = (float)kind, m->header[1] = (float)stage, m->header[2] = (float)mb;
  m->header[3] = (float)y->numel;
  m->data = common_malloc((y->numel ? y->numel : 1) * sizeof(float));
  if (!m->data) {
    message_free(m);
    return FL_ERR(FL_ENOMEM, "out of memory for a message of %zu floats", y->numel);
  }
  if (y->numel) {
    s = t->dev->ops->to_host(t->dev, m->data, y->data, y->numel * sizeof(float));
    if (s != FL_OK) {
      message_free(m);
      return s;
    }
  }
  pthread_mutex_lock(&t->lock);
  t->pending++;
  if (t->out_tail) t->out_tail->next = m;
  else t->out_head = m;
  t->out_tail = m;
  pthread_cond_signal(&t->ready);
  pthread_mutex_unlock(&t->lock);
  return FL_OK;
}

fl_status pp_transfer_drain(pp_trainer *t) {
  pthread_mutex_lock(&t->lock);
  while (t->pending > 0) pthread_cond_wait(&t->drained, &t->lock);
  pthread_mutex_unlock(&t->lock);
  return sender_failure(t);
}

static bool message_is(const message *m, int peer, int kind, int stage, int mb) {
  return m->peer == peer && (int)m->header[0] == kind && (int)m->header[1] == stage &&
         (int)m->header[2] == mb;
}

fl_status pp_transfer_recv(pp_trainer *t, int peer, int kind, int stage, int mb, fl_tensor *dst) {
  message *m = NULL;
  for (message **p = &t->mailbox; *p; p = &(*p)->next) {
    if (message_is(*p, peer, kind, stage, mb)) {
      m = *p;
      *p = m->next;
      break;
    }
  }
  while (!m) {
    message *in = common_calloc(1, sizeof *in);
    if (!in) return FL_ERR(FL_ENOMEM, "out of memory for a message");
    in->peer = peer;
    fl_tensor h = pp_host_tensor(t, in->header, MSG_HEADER_FLOATS);
    fl_status s = fl_comm_recv(t->pp, &h, peer);
    if (s != FL_OK) {
      message_free(in);
      return s;
    }
    float n = in->header[3];
    int k = (int)in->header[0];
    if ((k != MSG_ACTIVATION && k != MSG_GRADIENT) || !(n >= 0) || n > 1e9f) {
      double kind_seen = in->header[0];
      message_free(in);
      return fl_set_error(FL_EPROTO, "pipeline rank %d: a message from pipeline rank %d has a bad "
                          "header (kind %g, %g floats)", t->me.pp, peer, kind_seen, (double)n);
    }
    in->count = (size_t)n;
    in->data = common_malloc((in->count ? in->count : 1) * sizeof(float));
    if (!in->data) {
      size_t count = in->count;
      message_free(in);
      return FL_ERR(FL_ENOMEM, "out of memory for a message of %zu floats", count);
    }
    fl_tensor d = pp_host_tensor(t, in->data, in->count);
    if (in->count && (s = fl_comm_recv(t->pp, &d, peer)) != FL_OK) {
      message_free(in);
      return s;
    }
    if (message_is(in, peer, kind, stage, mb)) {
      m = in;
    } else {
      in->next = t->mailbox;
      t->mailbox = in;
    }
  }
  fl_status s = FL_OK;
  if (m->count != dst->numel)
    s = fl_set_error(FL_EPROTO, "pipeline rank %d: the %s of stage %d micro-batch %d from pipeline "
                     "rank %d has %zu floats, expected %zu", t->me.pp,
                     kind == MSG_ACTIVATION ? "activation" : "gradient", stage, mb, peer, m->count,
                     dst->numel);
  else if (m->count)
    s = t->dev->ops->from_host(t->dev, dst->data, m->data, m->count * sizeof(float));
  message_free(m);
  return s;
}

void pp_transfer_init(pp_trainer *t) {
  pthread_mutex_init(&t->lock, NULL);
  pthread_cond_init(&t->ready, NULL);
  pthread_cond_init(&t->drained, NULL);
}

fl_status pp_transfer_start(pp_trainer *t) {
  if (pthread_create(&t->sender, NULL, sender_main, t) != 0)
    return FL_ERR(FL_EINTERNAL, "cannot start the pipeline's sender thread");
  t->sender_started = true;
  return FL_OK;
}

void pp_transfer_stop(pp_trainer *t) {
  if (t->sender_started) {
    pthread_mutex_lock(&t->lock);
    t->closing = true;
    pthread_cond_signal(&t->ready);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->sender, NULL);
  }
  pthread_mutex_destroy(&t->lock);
  pthread_cond_destroy(&t->ready);
  pthread_cond_destroy(&t->drained);
  for (message *m = t->mailbox, *next; m; m = next) {
    next = m->next;
    message_free(m);
  }
}
