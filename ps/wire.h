/*
 * ps/wire.h: what the parameter server (ps/server.c) and its client (ps/client.c) share,
 * private to ps/: the frames on the wire and blocking socket I/O with deadlines (ps/wire.c).
 *
 * Every frame is a 64-byte header and a payload (integers little-endian, the host order of
 * every platform flint supports):
 *    0 u32 magic PS_WIRE_MAGIC   4 u8 version   5 u8 op (ps_op, | PS_OP_REPLY in answers,
 *    | PS_OP_FORWARDED from a primary)   6 u16 status (answers: an fl_status)
 *    8 u32 table   12 u32 shard   16 u32 worker   20 u32 staleness (pulls)
 *   24 u64 seq (the worker's request number on this shard; mutating requests)
 *   32 u64 clock (pulls: the worker's clock; answers: the shard's smallest clock)
 *   40 u64 arg (ranges: the first key; keyed requests: the number of keys)
 *   48 u64 payload length   56 u32 CRC32C of the payload   60 u32 CRC32C of bytes 0..59
 * Payloads: HELLO the secret; HOST the table (ps_wire_host_encode); PUSH n keys then n x width
 * floats; PULL n keys; PUSH_RANGE / SET_RANGE count x width floats; PULL_RANGE a u64 count;
 * LOAD a shard blob; PROMOTE and DROP nothing; REPLICATE (to a primary) the new backup's
 * address, to which the primary sends HOST (arg 1: as a backup) and ADOPT, the shard's whole
 * replica state (ps_wire_replica_*), before it forwards to it; CLOCK_OF nothing (the answer's
 * clock is the worker's, its payload the u64 sequence number of the worker's last change); TARGETS a target list (ps_wire_targets_encode); WHERE nothing (the
 * answer is the replica's target list); COLUMN a column operation's descriptor
 * (ps_wire_column_*), then for PUSH and SET its count floats; CLOCKS nothing (the answer: u32
 * n, u32 zero, then n u64 clocks, worker by worker, UINT64_MAX for a retired one; n is the
 * table's workers, at most PS_WIRE_CLOCKS_MAX: the web UI's view of a shard). Answers carry the values
 * (pulls, column PULL), the partial sum as an f64 (column DOT), the blob (SAVE), the new
 * clock (CLOCK, in `clock`), or the error message when status != 0.
 */
#ifndef FLINT_PS_WIRE_H
#define FLINT_PS_WIRE_H

#include "ps/ps.h"

#define PS_WIRE_MAGIC 0x53504c46u /* "FLPS" in memory */
#define PS_WIRE_VERSION 1
#define PS_WIRE_HEADER 64
#define PS_WIRE_MESSAGE_MAX 1000 /* an error message's bytes at most */
#define PS_WIRE_CLOCKS_MAX 4096  /* workers whose clocks a CLOCKS answer carries */

typedef enum ps_op {
  PS_OP_HELLO = 1,
  PS_OP_HOST,
  PS_OP_PUSH,
  PS_OP_PULL,
  PS_OP_PUSH_RANGE,
  PS_OP_PULL_RANGE,
  PS_OP_SET_RANGE,
  PS_OP_CLOCK,
  PS_OP_RETIRE,
  PS_OP_SAVE,
  PS_OP_LOAD,
  PS_OP_PROMOTE,
  PS_OP_DROP,
  PS_OP_REPLICATE,
  PS_OP_ADOPT,
  PS_OP_CLOCK_OF,
  PS_OP_TARGETS,
  PS_OP_WHERE,
  PS_OP_COLUMN,
  PS_OP_CLOCKS,
} ps_op;
#define PS_OP_LAST PS_OP_CLOCKS
#define PS_OP_FORWARDED 0x40
#define PS_OP_REPLY 0x80

typedef struct ps_frame {
  uint8_t op;
  uint16_t status;
  uint32_t table, shard, worker, staleness;
  uint64_t seq, clock, arg, len;
  uint32_t crc; /* of the payload */
} ps_frame;

void ps_wire_encode(uint8_t out[PS_WIRE_HEADER], const ps_frame *f);
/* NULL, or what is wrong with the header (magic, version, checksum, op). */
const char *ps_wire_decode(const uint8_t in[PS_WIRE_HEADER], ps_frame *f);
const char *ps_op_name(uint8_t op);

/* HOST's payload: the table's spec, shards, index, workers and the replicas this one forwards
 * to (arg 1 in the frame: it is a backup, not the primary). */
typedef struct ps_host_request {
  ps_table_spec spec;
  uint32_t shards, index, workers;
  uint32_t num_targets;
  char targets[PS_MAX_BACKUPS][PS_ADDRESS_MAX];
} ps_host_request;
/* A list of addresses: u32 count (at most PS_MAX_BACKUPS), then each as u16 length and bytes.
 * Decode checks it all and says how many bytes it took. */
fl_status ps_wire_targets_encode(const char (*targets)[PS_ADDRESS_MAX], uint32_t n, fl_buf *out);
fl_status ps_wire_targets_decode(fl_bytes in, char (*targets)[PS_ADDRESS_MAX], uint32_t *n, size_t *used);
fl_status ps_wire_host_encode(const ps_host_request *h, fl_buf *out);
fl_status ps_wire_host_decode(fl_bytes in, ps_host_request *h);

/* A shard's replica state: what a new backup needs to take over from the primary: the
 * workers' clocks, retirements and last sequence numbers, then the shard's blob.
 *   0 u32 workers   4 u32 zero   8 per worker: u64 clock, u64 last seq, u64 retired (0/1)
 *   then the blob (ps_shard_encode) */
fl_status ps_wire_replica_encode(const ps_shard *shard, ps_clocks *clocks, const uint64_t *last_seq, uint32_t workers,
                                 fl_buf *out);
/* Checks everything, then replaces the shard, clocks and sequence numbers. */
fl_status ps_wire_replica_adopt(fl_bytes in, ps_shard *shard, ps_clocks *clocks, uint64_t *last_seq, uint32_t workers);

/* COLUMN's descriptor, 40 bytes:
 *   0 u8 kind (ps_column_kind)   1 u8[3] zero   4 u32 x   8 u32 y   12 u32 zero   16 f64 alpha
 *   24 u64 lo   32 u64 count */
#define PS_WIRE_COLUMN_BYTES 40
void ps_wire_column_encode(const ps_column_op *op, uint8_t out[PS_WIRE_COLUMN_BYTES]);
/* FL_EPROTO when the payload is too short or its zero bytes are not, FL_EINVAL for an
 * unknown kind. */
fl_status ps_wire_column_decode(fl_bytes in, ps_column_op *op);

/* ---- sockets: blocking, with deadlines (common_now_ns time; 0: none) ---- */
/* "HOST:PORT" -> a connected TCP socket (TCP_NODELAY), within timeout_ms; FL_ENET naming the
 * address and the cause. */
fl_status ps_wire_connect(const char *address, uint32_t timeout_ms, int *fd);
fl_status ps_wire_listen(const char *host, int port, int *fd, int *bound_port);
/* Sends the header and up to two payload parts (the frame's len is their sum) as one frame.
 * FL_ENET on a broken connection, FL_ETIMEDOUT at the deadline. */
fl_status ps_wire_send(int fd, const ps_frame *f, const void *a, size_t alen, const void *b, size_t blen,
                       uint64_t deadline_ns, const char *peer);
/* Reads exactly len bytes. FL_ENET (peer closed or reset: `eof` says a clean close before the
 * first byte), FL_ETIMEDOUT. */
fl_status ps_wire_read(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *peer, bool *eof);
/* Reads a frame's header and its payload into *payload (replacing its contents; at most
 * max_len bytes, else FL_EPROTO) and checks both checksums (FL_ECORRUPT). */
fl_status ps_wire_recv(int fd, ps_frame *f, fl_buf *payload, uint64_t max_len, uint64_t first_deadline_ns,
                       uint32_t timeout_ms, const char *peer, bool *eof);

static inline uint64_t ps_wire_deadline(uint32_t timeout_ms) {
  return common_now_ns() + (uint64_t)timeout_ms * 1000000u;
}

#endif /* FLINT_PS_WIRE_H */
