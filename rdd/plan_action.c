/*
 * plan_action.c: actions as bytes (PlanAction of proto/plan.proto), so that a client can
 * send the action of a job with the job's plan. Decoding checks that the fields fit the
 * action's kind and resolves its functions through the plan's codec (plan_fn.c).
 */
#include <string.h>

#include "rdd/plan_internal.h"

/* Actions that write into a folder. */
static bool action_has_path(rdd_action_kind kind) {
  return kind == RDD_ACTION_SAVE_TEXT || kind == RDD_ACTION_CHECKPOINT;
}

fl_status rdd_action_encode(const rdd_action *a, const rdd_fn_codec *codec, fl_buf *out) {
  if (!a || !out) return FL_ERR(FL_EINVAL, "rdd_action_encode: NULL argument");
  if (a->kind > RDD_ACTION_CHECKPOINT)
    return FL_ERR(FL_EINVAL, "rdd_action_encode: action kind %d cannot be sent", (int)a->kind);
  if (a->arg_len && !a->arg) return FL_ERR(FL_EINVAL, "rdd_action_encode: arg_len without arg");
  rdd_plan_enc e = {codec, 0, NULL, 0, 0};
  Flint__PlanAction m = FLINT__PLAN_ACTION__INIT;
  fl_status s;
  m.kind = (uint32_t)a->kind;
  m.limit = a->limit;
  m.has_zero = a->has_zero;
  if (a->has_zero) m.zero = (ProtobufCBinaryData){a->zero.len, (uint8_t *)a->zero.data};
  m.arg = (ProtobufCBinaryData){a->arg_len, (uint8_t *)a->arg};
  if (action_has_path(a->kind)) m.path = (char *)(a->path ? a->path : "");
  const char *seq_kind = a->has_zero ? "aggregate" : "reduce";
  if ((s = rdd_plan_encode_fn(&e, (void (*)(void))a->seq, seq_kind, &m.seq)) == FL_OK &&
      (s = rdd_plan_encode_fn(&e, (void (*)(void))a->foreach_fn, "foreach", &m.foreach_fn)) == FL_OK) {
    size_t len = flint__plan_action__get_packed_size(&m);
    if ((s = fl_buf_reserve(out, len)) == FL_OK) {
      flint__plan_action__pack(&m, out->data + out->len);
      out->len += len;
    }
  }
  rdd_plan_enc_free(&e);
  return s;
}

fl_status rdd_action_decode(rdd_plan *p, fl_bytes in, rdd_action *out) {
  if (!p || !out || (in.len && !in.data)) return FL_ERR(FL_EINVAL, "rdd_action_decode: NULL argument");
  rdd_plan_dec d = {p, 0, "action", {0}};
  rdd_plan_unpack_start();
  Flint__PlanAction *m = flint__plan_action__unpack(&rdd_plan_pb_allocator, in.len, in.data);
  if (!m) return rdd_plan_unpack_failed("the PlanAction", in.len);
  rdd_action a = {0};
  fl_status status = FL_OK;
  void (*seq)(void) = NULL, (*foreach_fn)(void) = NULL;
  if (m->kind > RDD_ACTION_CHECKPOINT) {
    status = rdd_plan_bad(&d, "unknown action kind %u", m->kind);
    goto cleanup;
  }
  a.kind = (rdd_action_kind)m->kind;
  FL_CHECK(rdd_plan_decode_fn(&d, m->seq, m->has_zero ? "aggregate" : "reduce", &seq));
  FL_CHECK(rdd_plan_decode_fn(&d, m->foreach_fn, "foreach", &foreach_fn));
  if ((a.kind == RDD_ACTION_AGGREGATE) != (seq != NULL) || (a.kind == RDD_ACTION_FOREACH) != (foreach_fn != NULL)) {
    status = rdd_plan_bad(&d, "functions do not fit action kind %u", m->kind);
    goto cleanup;
  }
  if (action_has_path(a.kind) != (m->path[0] != '\0') || strlen(m->path) >= 4096) {
    status = rdd_plan_bad(&d, "output path does not fit action kind %u", m->kind);
    goto cleanup;
  }
  if ((m->limit && a.kind != RDD_ACTION_COLLECT) || (m->has_zero && a.kind != RDD_ACTION_AGGREGATE) ||
      (!m->has_zero && m->zero.len) || (m->arg.len && !seq && !foreach_fn)) {
    status = rdd_plan_bad(&d, "fields of another kind on action kind %u", m->kind);
    goto cleanup;
  }
  a.limit = m->limit;
  a.seq = (fl_reduce_fn)seq;
  a.foreach_fn = (fl_foreach_fn)foreach_fn;
  a.has_zero = m->has_zero;
  if (m->has_zero) {
    uint8_t *zero = common_memdup(m->zero.data, m->zero.len ? m->zero.len : 1);
    if (!zero) goto nomem;
    a.zero = fl_bytes_of(zero, m->zero.len);
  }
  if (m->arg.len) {
    if (!(a.arg = common_memdup(m->arg.data, m->arg.len))) goto nomem;
    a.arg_len = m->arg.len;
  }
  if (action_has_path(a.kind) && !(a.path = common_strdup(m->path))) goto nomem;
  *out = a;
  memset(&a, 0, sizeof a);
  goto cleanup;
nomem:
  status = FL_ERR(FL_ENOMEM, "cannot decode an action");
cleanup:
  rdd_action_clear(&a);
  flint__plan_action__free_unpacked(m, &rdd_plan_pb_allocator);
  return status;
}

void rdd_action_clear(rdd_action *a) {
  if (!a) return;
  common_free((void *)a->zero.data);
  common_free((void *)a->arg);
  common_free((void *)a->path);
  memset(a, 0, sizeof *a);
}
