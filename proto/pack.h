/*
 * pack.h: a control-plane message into bytes, for the layers that speak the control plane
 * (driver, executor). The messages themselves are generated from the .proto files here.
 */
#ifndef FLINT_PROTO_PACK_H
#define FLINT_PROTO_PACK_H

#include <protobuf-c/protobuf-c.h>

#include "common/common.h"

/* Replaces out's bytes with the packed message. FL_ENOMEM leaves out as it was. */
static inline fl_status proto_pack(const ProtobufCMessage *msg, fl_buf *out) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  out->len = 0;
  fl_status st = fl_buf_reserve(out, n ? n : 1);
  if (st != FL_OK) return st;
  out->len = protobuf_c_message_pack(msg, out->data);
  return FL_OK;
}

#endif /* FLINT_PROTO_PACK_H */
