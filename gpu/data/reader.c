/*
 * gpu/data/reader.c: the rank's reader of gpu/data/data.h: a partition's images in host
 * memory, handed out as (shuffled) mini-batches. One rank's thread.
 *
 * A reader given a transform (data_reader_set_transform) holds image records (uint8, at the
 * cache's resolution) instead of float images, and transforms each one as it hands it out,
 * with the epoch of data_reader_start_epoch: a new random crop of every image every epoch.
 *
 * Prefetch (on unless data_reader_set_prefetch turned it off), as PyTorch's DataLoader and
 * tf.data prefetch: a thread of the reader's own, started by the first epoch, fills a slot
 * with batch i + 1 while the rank trains on batch i, and data_reader_next copies the slot into
 * the caller's buffer (a memcpy, against the gather and the transforms it hides). The thread
 * runs the very code the synchronous path runs (reader_fill) in the same order, and every
 * transform's draws come from (seed, epoch, image): the batches are the same bit for bit.
 *
 * Threading: the rank's thread alone moves the epoch's position (pos, handed), as it hands a
 * batch out and before it asks for the next; the prefetch thread reads the position and the
 * images only while the slot is WANTED or FILLING. Whatever changes them (start_epoch, add_*,
 * set_prefetch, destroy) first takes the slot back (prefetch_quiesce), which asks the thread
 * to drop a batch half made (`cancel`, checked per image) and waits for it. The slot's state,
 * count and status move under `lock`. A failure on the thread is carried with its message
 * (messages are thread-local) and set again on the rank's thread.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/data/image_internal.h"
#include "gpu/data/sources.h"

/* The prefetch slot's states. */
typedef enum slot_state {
  SLOT_EMPTY = 0, /* nothing asked for */
  SLOT_WANTED,    /* the next batch is asked for; the thread has not taken it up yet */
  SLOT_FILLING,   /* the thread is making it */
  SLOT_READY,     /* made: count images (0: the epoch's end, or `status` failed) */
} slot_state;

typedef struct prefetch {
  bool started; /* the thread runs */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond; /* any change of state or stop */
  slot_state state;
  bool stop;
  atomic_bool cancel; /* drop the batch being made (read per image) */
  float *images;      /* the slot: batch * per floats */
  int32_t *labels;
  uint32_t count;
  fl_status status;
  char why[512]; /* status's message */
} prefetch;

struct data_reader {
  uint32_t batch;
  uint32_t channels, height, width, classes;
  size_t per; /* floats per image */
  uint64_t n, cap;
  int32_t *labels;
  float *images;
  uint64_t *order; /* this epoch's order, n entries */
  uint64_t pos, handed, max_batches;
  bool partial;
  /* With a transform: image records back to back in `raw`, image i's at raw_off[i]. */
  bool transform;
  fl_image_transform t;
  uint32_t epoch;
  fl_buf raw;
  uint64_t *raw_off;
  fl_status failed; /* a transform's failure in data_reader_next (data_reader_status) */
  bool prefetch_on; /* data_reader_set_prefetch (default on) */
  prefetch pf;
};

fl_status data_reader_create(uint32_t batch, data_reader **out) {
  if (batch == 0) return fl_set_error(FL_EINVAL, "data_reader_create: batch 0");
  data_reader *r = common_calloc(1, sizeof *r);
  if (!r) return fl_set_error(FL_ENOMEM, "data_reader_create: out of memory");
  r->batch = batch;
  r->prefetch_on = true;
  FL_PCHECK(pthread_mutex_init(&r->pf.lock, NULL));
  FL_PCHECK(pthread_cond_init(&r->pf.cond, NULL));
  atomic_init(&r->pf.cancel, false);
  *out = r;
  return FL_OK;
}

/* Takes the slot back from the thread: a batch it is making is dropped (it stops at the next
 * image), one made or asked for is forgotten (the position is still before it). After it,
 * the rank's thread alone reads the images and the position until it asks again. */
static void prefetch_quiesce(data_reader *r) {
  prefetch *pf = &r->pf;
  if (!pf->started) return;
  FL_PCHECK(pthread_mutex_lock(&pf->lock));
  if (pf->state == SLOT_FILLING) {
    atomic_store(&pf->cancel, true);
    while (pf->state == SLOT_FILLING) FL_PCHECK(pthread_cond_wait(&pf->cond, &pf->lock));
    atomic_store(&pf->cancel, false);
  }
  pf->state = SLOT_EMPTY;
  FL_PCHECK(pthread_mutex_unlock(&pf->lock));
}

static void prefetch_stop(data_reader *r) {
  prefetch *pf = &r->pf;
  if (!pf->started) return;
  prefetch_quiesce(r);
  FL_PCHECK(pthread_mutex_lock(&pf->lock));
  pf->stop = true;
  FL_PCHECK(pthread_cond_broadcast(&pf->cond));
  FL_PCHECK(pthread_mutex_unlock(&pf->lock));
  FL_PCHECK(pthread_join(pf->thread, NULL));
  pf->started = false;
  pf->stop = false;
}

void data_reader_destroy(data_reader *r) {
  if (!r) return;
  prefetch_stop(r);
  common_free(r->pf.images);
  common_free(r->pf.labels);
  FL_PCHECK(pthread_cond_destroy(&r->pf.cond));
  FL_PCHECK(pthread_mutex_destroy(&r->pf.lock));
  common_free(r->labels);
  common_free(r->images);
  common_free(r->order);
  common_free(r->raw_off);
  fl_buf_free(&r->raw);
  common_free(r);
}

fl_status data_reader_set_transform(data_reader *r, const fl_image_transform *t, uint32_t classes) {
  if (r->n || r->per) return fl_set_error(FL_ESTATE, "data reader: a transform after images were added");
  fl_status s = fl_image_transform_check(t);
  if (s != FL_OK) return s;
  if (classes == 0) return fl_set_error(FL_EINVAL, "data reader: 0 classes");
  r->transform = true;
  r->t = *t;
  r->channels = 3;
  r->height = r->width = t->size;
  r->classes = classes;
  r->per = (size_t)3 * t->size * t->size;
  return FL_OK;
}

fl_status data_reader_status(const data_reader *r) { return r->failed; }

/* Room for one more image's label, order and offset (a transforming reader). */
static fl_status raw_grow(data_reader *r) {
  if (r->n < r->cap) return FL_OK;
  uint64_t cap = r->cap ? r->cap * 2 : 1024;
  int32_t *labels = common_realloc(r->labels, cap * sizeof *labels);
  if (labels) r->labels = labels;
  uint64_t *order = labels ? common_realloc(r->order, cap * sizeof *order) : NULL;
  if (order) r->order = order;
  uint64_t *off = order ? common_realloc(r->raw_off, cap * sizeof *off) : NULL;
  if (!off) return fl_set_error(FL_ENOMEM, "data reader: out of memory for %llu images", (unsigned long long)cap);
  r->raw_off = off;
  r->cap = cap;
  return FL_OK;
}

fl_status data_reader_add_image(data_reader *r, fl_bytes rec) {
  prefetch_quiesce(r); /* the arrays may move */
  if (!r->transform)
    return fl_set_error(FL_ECORRUPT, "image blocks: an image record where only image blocks were expected");
  fl_image_view v;
  fl_status s = fl_image_record_view(rec, &v);
  if (s != FL_OK) return s;
  if (v.label < 0 || (uint32_t)v.label >= r->classes)
    return fl_set_error(FL_ECORRUPT, "image record %llu: label %d outside [0, %u)", (unsigned long long)v.index,
                        v.label, r->classes);
  if ((s = raw_grow(r)) != FL_OK) return s;
  r->raw_off[r->n] = r->raw.len;
  if ((s = fl_buf_append(&r->raw, rec.data, rec.len)) != FL_OK) return s;
  r->labels[r->n] = v.label;
  r->order[r->n] = r->n;
  r->n++;
  return FL_OK;
}

fl_status data_reader_add_block(data_reader *r, fl_bytes rec) {
  prefetch_quiesce(r); /* the arrays may move */
  if (r->transform) return fl_set_error(FL_ECORRUPT, "image blocks: a block where only image records were expected");
  data_block b;
  fl_status s = data_block_view(rec, &b);
  if (s != FL_OK) return s;
  if (r->per == 0) {
    r->channels = b.channels;
    r->height = b.height;
    r->width = b.width;
    r->classes = b.classes;
    r->per = (size_t)b.channels * b.height * b.width;
  } else if (b.channels != r->channels || b.height != r->height || b.width != r->width || b.classes != r->classes) {
    return fl_set_error(FL_ECORRUPT, "image block of %u x %u x %u images (%u classes) after blocks of %u x %u x %u "
                        "(%u classes)", b.channels, b.height, b.width, b.classes, r->channels, r->height, r->width,
                        r->classes);
  }
  if (r->n + b.count > r->cap) {
    uint64_t cap = r->cap ? r->cap : 1024;
    while (cap < r->n + b.count) cap *= 2;
    int32_t *labels = common_realloc(r->labels, cap * sizeof *labels);
    if (labels) r->labels = labels;
    float *images = labels ? common_realloc(r->images, cap * r->per * sizeof *images) : NULL;
    if (images) r->images = images;
    uint64_t *order = images ? common_realloc(r->order, cap * sizeof *order) : NULL;
    if (!order) return fl_set_error(FL_ENOMEM, "data reader: out of memory for %llu images", (unsigned long long)cap);
    r->order = order;
    r->cap = cap;
  }
  memcpy(r->labels + r->n, b.labels, (size_t)b.count * 4);
  memcpy(r->images + r->n * r->per, b.images, (size_t)b.count * r->per * sizeof(float));
  for (uint32_t i = 0; i < b.count; i++) r->order[r->n + i] = r->n + i;
  r->n += b.count;
  return FL_OK;
}

fl_status data_reader_add_all(fl_iter *in, data_reader *train, data_reader *test) {
  fl_bytes rec;
  while (fl_iter_next(in, &rec)) {
    uint32_t magic = 0;
    if (rec.len >= 4) memcpy(&magic, rec.data, 4);
    if (magic == FL_IMAGE_MAGIC) { /* image records are training images, to be transformed */
      fl_status s = data_reader_add_image(train, rec);
      if (s != FL_OK) return s;
      continue;
    }
    data_block b = {0}; /* gcc's -O3 cannot see that b.split is read only when the view succeeded */
    fl_status s = data_block_view(rec, &b);
    if (s == FL_OK && b.split == DATA_SPLIT_TEST && !test)
      s = fl_set_error(FL_ECORRUPT, "image blocks: a test block where only training blocks were expected");
    if (s == FL_OK) s = data_reader_add_block(b.split == DATA_SPLIT_TEST ? test : train, rec);
    if (s != FL_OK) return s;
  }
  return FL_OK;
}

uint64_t data_reader_images(const data_reader *r) { return r->n; }
uint32_t data_reader_channels(const data_reader *r) { return r->channels; }
uint32_t data_reader_height(const data_reader *r) { return r->height; }
uint32_t data_reader_width(const data_reader *r) { return r->width; }
uint32_t data_reader_classes(const data_reader *r) { return r->classes; }
size_t data_reader_image_floats(const data_reader *r) { return r->per; }

uint64_t data_reader_batches(const data_reader *r, bool partial) {
  return partial ? (r->n + r->batch - 1) / r->batch : r->n / r->batch;
}

/* The batch at the epoch's position into images and labels: what data_reader_next hands out,
 * made on the rank's thread or the prefetch thread (the only difference: `cancel`, which
 * stops a batch half made, *cancelled set). It does not move the position: the caller does,
 * as it hands the batch out (reader_advance), so that a batch made ahead and then dropped is
 * not lost. A transform's failure returns 0 with *status set. */
static uint32_t reader_fill(data_reader *r, float *images, int32_t *labels, const atomic_bool *cancel,
                            fl_status *status, bool *cancelled) {
  *status = FL_OK;
  *cancelled = false;
  if (r->max_batches && r->handed >= r->max_batches) return 0;
  uint64_t left = r->n - r->pos;
  if (left == 0 || (left < r->batch && !r->partial)) return 0;
  uint32_t count = left < r->batch ? (uint32_t)left : r->batch;
  for (uint32_t i = 0; i < count; i++) {
    if (cancel && atomic_load_explicit(cancel, memory_order_relaxed)) {
      *cancelled = true;
      return 0;
    }
    uint64_t k = r->order[r->pos + i];
    labels[i] = r->labels[k];
    if (!r->transform) {
      memcpy(images + (size_t)i * r->per, r->images + k * r->per, r->per * sizeof(float));
      continue;
    }
    fl_image_view v;
    uint64_t end = k + 1 < r->n ? r->raw_off[k + 1] : r->raw.len;
    fl_status s = fl_image_record_view(fl_bytes_of(r->raw.data + r->raw_off[k], end - r->raw_off[k]), &v);
    if (s == FL_OK) s = image_transform_view(&r->t, r->epoch, &v, images + (size_t)i * r->per);
    if (s != FL_OK) {
      *status = s;
      return 0;
    }
  }
  return count;
}

static void reader_advance(data_reader *r, uint32_t count) {
  if (!count) return;
  r->pos += count;
  r->handed++;
}

/* The prefetch thread: makes the batch asked for into the slot, one at a time. */
static void *prefetch_main(void *arg) {
  data_reader *r = arg;
  prefetch *pf = &r->pf;
  FL_PCHECK(pthread_mutex_lock(&pf->lock));
  for (;;) {
    while (!pf->stop && pf->state != SLOT_WANTED) FL_PCHECK(pthread_cond_wait(&pf->cond, &pf->lock));
    if (pf->stop) break;
    pf->state = SLOT_FILLING;
    FL_PCHECK(pthread_mutex_unlock(&pf->lock));
    fl_status s;
    bool cancelled;
    uint32_t count = reader_fill(r, pf->images, pf->labels, &pf->cancel, &s, &cancelled);
    FL_PCHECK(pthread_mutex_lock(&pf->lock));
    if (cancelled) {
      pf->state = SLOT_EMPTY;
    } else {
      pf->count = count;
      pf->status = s;
      if (s != FL_OK) snprintf(pf->why, sizeof pf->why, "%s", fl_last_error());
      pf->state = SLOT_READY;
    }
    FL_PCHECK(pthread_cond_broadcast(&pf->cond));
  }
  FL_PCHECK(pthread_mutex_unlock(&pf->lock));
  return NULL;
}

/* The slot and the thread, made once (the first epoch with images). False when either cannot
 * be had: the reader then stays synchronous, which hands out the same batches. */
static bool prefetch_start(data_reader *r) {
  prefetch *pf = &r->pf;
  if (pf->started) return true;
  if (!pf->images) {
    pf->images = common_malloc((size_t)r->batch * r->per * sizeof(float));
    pf->labels = common_malloc((size_t)r->batch * sizeof(int32_t));
    if (!pf->images || !pf->labels) {
      common_free(pf->images);
      common_free(pf->labels);
      pf->images = NULL, pf->labels = NULL;
      common_log(LOG_WARN, "data reader: no memory for the prefetch buffer (%zu bytes): batches are made on demand",
                 (size_t)r->batch * r->per * sizeof(float));
      r->prefetch_on = false;
      return false;
    }
  }
  pf->state = SLOT_EMPTY;
  int e = pthread_create(&pf->thread, NULL, prefetch_main, r);
  if (e != 0) {
    common_log(LOG_WARN, "data reader: no prefetch thread (%s): batches are made on demand", strerror(e));
    r->prefetch_on = false; /* not again every epoch */
    return false;
  }
  pf->started = true;
  return true;
}

/* Asks the thread for the next batch (the slot is the rank thread's: EMPTY). */
static void prefetch_ask(prefetch *pf) {
  FL_PCHECK(pthread_mutex_lock(&pf->lock));
  pf->state = SLOT_WANTED;
  FL_PCHECK(pthread_cond_broadcast(&pf->cond));
  FL_PCHECK(pthread_mutex_unlock(&pf->lock));
}

void data_reader_set_prefetch(data_reader *r, bool on) {
  if (!on) prefetch_stop(r); /* a batch made ahead is dropped; the position is still before it */
  r->prefetch_on = on;
}

bool data_reader_prefetching(const data_reader *r) { return r->pf.started; }

void data_reader_start_epoch(data_reader *r, uint64_t seed, uint32_t epoch, bool shuffle, uint64_t max_batches,
                             bool partial) {
  prefetch_quiesce(r);
  r->pos = 0;
  r->handed = 0;
  r->max_batches = max_batches;
  r->partial = partial;
  r->epoch = epoch;
  for (uint64_t i = 0; i < r->n; i++) r->order[i] = i;
  if (shuffle) {
    uint64_t state = data_mix64(seed ^ data_mix64(0xe90c5u + epoch));
    for (uint64_t i = r->n; i > 1; i--) {
      state = data_mix64(state);
      /* Multiply-shift maps 64 random bits onto [0, i) (bias below 2^-40 for these sizes). */
      uint64_t j = (uint64_t)(((unsigned __int128)state * i) >> 64);
      uint64_t t = r->order[i - 1];
      r->order[i - 1] = r->order[j];
      r->order[j] = t;
    }
  }
  /* The first batch is made while the caller gets ready for it. */
  if (r->prefetch_on && r->n && r->per && prefetch_start(r)) prefetch_ask(&r->pf);
}

uint32_t data_reader_next(data_reader *r, float *images, int32_t *labels) {
  fl_status s;
  bool cancelled;
  if (!r->pf.started) {
    uint32_t count = reader_fill(r, images, labels, NULL, &s, &cancelled);
    if (s != FL_OK) r->failed = s;
    reader_advance(r, count);
    return count;
  }
  prefetch *pf = &r->pf;
  FL_PCHECK(pthread_mutex_lock(&pf->lock));
  if (pf->state == SLOT_EMPTY) { /* after the epoch's end or a failure: ask again, as the synchronous path would */
    pf->state = SLOT_WANTED;
    FL_PCHECK(pthread_cond_broadcast(&pf->cond));
  }
  while (pf->state != SLOT_READY) FL_PCHECK(pthread_cond_wait(&pf->cond, &pf->lock));
  uint32_t count = pf->count;
  s = pf->status;
  if (count) {
    memcpy(images, pf->images, (size_t)count * r->per * sizeof(float));
    memcpy(labels, pf->labels, (size_t)count * sizeof(int32_t));
  }
  reader_advance(r, count); /* before the thread may read the position again */
  /* The next one is made while the caller trains on this one. */
  pf->state = count ? SLOT_WANTED : SLOT_EMPTY;
  FL_PCHECK(pthread_cond_broadcast(&pf->cond));
  FL_PCHECK(pthread_mutex_unlock(&pf->lock));
  if (s != FL_OK) {
    r->failed = s;
    fl_set_error(s, "%s", pf->why);
  }
  return count;
}
