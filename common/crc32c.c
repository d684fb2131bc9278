/*
 * crc32c.c: CRC32C (Castagnoli), the checksum of data-plane frames and payloads
 * (net/dataplane*.c), shuffle and cache chunks (rdd/batch_codec.c) and checkpoint files
 * (rdd/checkpoint.c).
 *
 * zlib's crc32 runs at a few GB/s, about the speed of loopback TCP, and both ends checksum
 * every payload, so it would halve a fetch's throughput. CRC32C has an instruction (SSE4.2);
 * one stream of it is bound by its 3-cycle latency, so large inputs run as three interleaved
 * streams joined with the GF(2) shift below (as zlib's crc32_combine does). CPUs without it
 * use a slicing-by-8 table.
 */
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "common/config.h"

#define CRC32C_POLY 0x82f63b78u /* reflected */
#define CRC32C_BLOCK 8192       /* bytes per stream per round of the three-stream loop */

static uint32_t crc32c_table[8][256];
static uint32_t crc32c_shift_1block, crc32c_shift_2blocks; /* x^(8*BLOCK), x^(16*BLOCK) */
static bool crc32c_have_hw;
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

/* a * b modulo the polynomial, in the reflected representation (bit 31 is x^0). */
static uint32_t crc32c_multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
  }
  return p;
}

/* x^(8 * nbytes) modulo the polynomial. */
static uint32_t crc32c_x8n(uint64_t nbytes) {
  uint32_t result = 1u << 31, power = 1u << 30; /* x^0, x^1 */
  uint64_t n = nbytes * 8;
  while (n) {
    if (n & 1) result = crc32c_multmodp(power, result);
    power = crc32c_multmodp(power, power);
    n >>= 1;
  }
  return result;
}

static void crc32c_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    crc32c_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      crc32c_table[t][i] =
          (crc32c_table[t - 1][i] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
  crc32c_shift_1block = crc32c_x8n(CRC32C_BLOCK);
  crc32c_shift_2blocks = crc32c_x8n(2 * CRC32C_BLOCK);
#if defined(__x86_64__)
  __builtin_cpu_init();
  crc32c_have_hw = __builtin_cpu_supports("sse4.2") && !config_bool(CONFIG_NO_CRC32C_HW);
#endif
}

/* The register-level loops take and return the inverted CRC. */
static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t n) {
  while (n && ((uintptr_t)p & 7)) {
    crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= crc;
    crc = crc32c_table[7][w & 0xff] ^ crc32c_table[6][(w >> 8) & 0xff] ^
          crc32c_table[5][(w >> 16) & 0xff] ^ crc32c_table[4][(w >> 24) & 0xff] ^
          crc32c_table[3][(w >> 32) & 0xff] ^ crc32c_table[2][(w >> 40) & 0xff] ^
          crc32c_table[1][(w >> 48) & 0xff] ^ crc32c_table[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc32, const uint8_t *p,
                                                            size_t n) {
  uint64_t crc = crc32;
  while (n && ((uintptr_t)p & 7)) {
    crc = _mm_crc32_u8((uint32_t)crc, *p++);
    n--;
  }
  while (n >= 3 * CRC32C_BLOCK) {
    uint64_t c1 = 0, c2 = 0, w0, w1, w2;
    for (size_t i = 0; i < CRC32C_BLOCK; i += 8) {
      memcpy(&w0, p + i, 8);
      memcpy(&w1, p + CRC32C_BLOCK + i, 8);
      memcpy(&w2, p + 2 * CRC32C_BLOCK + i, 8);
      crc = _mm_crc32_u64(crc, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    /* The CRC register is linear: the first stream's value moves past the two later
     * blocks, the second's past one, and the three are xored. */
    crc = crc32c_multmodp(crc32c_shift_2blocks, (uint32_t)crc) ^
          crc32c_multmodp(crc32c_shift_1block, (uint32_t)c1) ^ (uint32_t)c2;
    p += 3 * CRC32C_BLOCK;
    n -= 3 * CRC32C_BLOCK;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    crc = _mm_crc32_u64(crc, w);
    p += 8;
    n -= 8;
  }
  while (n--) crc = _mm_crc32_u8((uint32_t)crc, *p++);
  return (uint32_t)crc;
}
#endif

uint32_t common_crc32c(uint32_t crc, const void *data, size_t len) {
  FL_PCHECK(pthread_once(&crc32c_once, crc32c_init));
  const uint8_t *p = data;
  if (len == 0) return crc;
#if defined(__x86_64__)
  if (crc32c_have_hw) return ~crc32c_hw(~crc, p, len);
#endif
  return ~crc32c_sw(~crc, p, len);
}
