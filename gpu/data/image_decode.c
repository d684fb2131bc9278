/*
 * gpu/data/image_decode.c: one JPEG (libjpeg-turbo) or PNG (libpng's simplified API) file into
 * RGB bytes, as include/flint/image.h's fl_image_decode_file promises. The file is read whole
 * first: its first bytes say the format, and both decoders then work from memory.
 *
 * libjpeg reports errors by calling error_exit, which must not return: ours longjmps back to
 * the decode with the library's message. Its warnings are ignored (PIL ignores them too),
 * except a file that ends early, which PIL refuses as truncated and so do we.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "common/common.h"
#include "flint/image.h"

/* Files above this size are refused (an ImageNet JPEG is about 110 KiB). */
#define IMAGE_MAX_FILE_BYTES (256u << 20)
/* Images above this many pixels are refused before any allocation (decompression bombs). */
#define IMAGE_MAX_PIXELS (1ull << 28)

static fl_status read_whole(const char *path, uint8_t **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "cannot open image %s: %s", path, strerror(errno));
  struct stat st;
  fl_status s = FL_OK;
  uint8_t *buf = NULL;
  if (fstat(fileno(f), &st) != 0) s = fl_set_error(FL_EIO, "cannot stat image %s: %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode)) s = fl_set_error(FL_EIO, "image %s is not a regular file", path);
  else if ((uint64_t)st.st_size > IMAGE_MAX_FILE_BYTES)
    s = fl_set_error(FL_EFORMAT, "image %s: %lld bytes (at most %u)", path, (long long)st.st_size,
                     IMAGE_MAX_FILE_BYTES);
  else if (!(buf = common_malloc((size_t)st.st_size + 1)))
    s = fl_set_error(FL_ENOMEM, "image %s: out of memory", path);
  else if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size || ferror(f))
    s = fl_set_error(FL_EIO, "cannot read image %s: %s", path, ferror(f) ? strerror(errno) : "shorter than its size");
  fclose(f);
  if (s != FL_OK) {
    common_free(buf);
    return s;
  }
  *data = buf;
  *len = (size_t)st.st_size;
  return FL_OK;
}

static fl_status check_size(const char *path, uint64_t w, uint64_t h) {
  if (w == 0 || h == 0 || w > 65535 || h > 65535 || w * h > IMAGE_MAX_PIXELS)
    return fl_set_error(FL_EFORMAT, "image %s: %llu x %llu pixels (at most 65535 a side and 2^28 in all)", path,
                        (unsigned long long)w, (unsigned long long)h);
  return FL_OK;
}

/* ---- JPEG ------------------------------------------------------------------------------ */

typedef struct jpeg_failure {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
} jpeg_failure;

static void jpeg_fail(j_common_ptr cinfo) {
  jpeg_failure *f = (jpeg_failure *)cinfo->err;
  f->mgr.format_message(cinfo, f->message);
  longjmp(f->jump, 1);
}

static void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
}

/* In place, n pixels of 4 bytes into n of 3 (each write is at or before its read). Adobe's
 * files (an Adobe marker, as Photoshop writes) store the inks inverted, 255 meaning none;
 * others store them plainly. No colour profile: the naive conversion, as PIL's. */
static void cmyk_to_rgb(uint8_t *p, size_t n, bool adobe_inverted) {
  for (size_t i = 0; i < n; i++) {
    unsigned c = p[4 * i], m = p[4 * i + 1], y = p[4 * i + 2], k = p[4 * i + 3];
    if (!adobe_inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    p[3 * i] = (uint8_t)((c * k + 127) / 255);
    p[3 * i + 1] = (uint8_t)((m * k + 127) / 255);
    p[3 * i + 2] = (uint8_t)((y * k + 127) / 255);
  }
}

static fl_status decode_jpeg(const char *path, const uint8_t *data, size_t len, uint32_t min_side, uint8_t **rgb,
                             uint32_t *height, uint32_t *width) {
  struct jpeg_decompress_struct cinfo;
  jpeg_failure err;
  /* Written after setjmp and read after the longjmp: volatile. */
  uint8_t *volatile pixels = NULL;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    common_free(pixels);
    return fl_set_error(FL_EFORMAT, "image %s: corrupt JPEG: %s", path, err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)len);
  jpeg_read_header(&cinfo, TRUE);
  /* CMYK and YCCK (ImageNet's training set has a few dozen, from Photoshop): libjpeg-turbo
   * gives CMYK, turned into RGB below. Otherwise RGB; grayscale is replicated. */
  bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  uint32_t short_side = cinfo.image_width < cinfo.image_height ? cinfo.image_width : cinfo.image_height;
  if (min_side) /* DCT scaling: decode at 1/2, 1/4 or 1/8 when the shorter side stays >= min_side */
    for (unsigned d = 8; d >= 2; d /= 2)
      if (short_side / d >= min_side) {
        cinfo.scale_num = 1;
        cinfo.scale_denom = d;
        break;
      }
  jpeg_calc_output_dimensions(&cinfo);
  fl_status s = check_size(path, cinfo.output_width, cinfo.output_height);
  if (s != FL_OK) {
    jpeg_destroy_decompress(&cinfo);
    return s;
  }
  size_t row = (size_t)cinfo.output_width * (cmyk ? 4 : 3);
  pixels = common_malloc(row * cinfo.output_height);
  if (!pixels) {
    jpeg_destroy_decompress(&cinfo);
    return fl_set_error(FL_ENOMEM, "image %s: out of memory", path);
  }
  jpeg_start_decompress(&cinfo);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW rows[4];
    for (int i = 0; i < 4; i++) {
      uint32_t y = cinfo.output_scanline + (uint32_t)i < cinfo.output_height ? cinfo.output_scanline + (uint32_t)i
                                                                             : cinfo.output_height - 1;
      rows[i] = pixels + y * row;
    }
    jpeg_read_scanlines(&cinfo, rows, 4);
  }
  jpeg_finish_decompress(&cinfo);
  if (cmyk) cmyk_to_rgb(pixels, (size_t)cinfo.output_width * cinfo.output_height, cinfo.saw_Adobe_marker);
  *height = cinfo.output_height;
  *width = cinfo.output_width;
  jpeg_destroy_decompress(&cinfo);
  *rgb = pixels;
  return FL_OK;
}

/* ---- PNG ------------------------------------------------------------------------------- */

static fl_status decode_png(const char *path, const uint8_t *data, size_t len, uint8_t **rgb, uint32_t *height,
                            uint32_t *width) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data, len))
    return fl_set_error(FL_EFORMAT, "image %s: corrupt PNG: %s", path, img.message);
  fl_status s = check_size(path, img.width, img.height);
  if (s != FL_OK) {
    png_image_free(&img);
    return s;
  }
  /* With alpha: read RGBA and drop A (PIL's convert("RGB") drops it, it does not composite). */
  bool alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  img.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  size_t n = (size_t)img.width * img.height;
  uint8_t *pixels = common_malloc(n * (alpha ? 4 : 3));
  if (!pixels) {
    png_image_free(&img);
    return fl_set_error(FL_ENOMEM, "image %s: out of memory", path);
  }
  if (!png_image_finish_read(&img, NULL, pixels, 0, NULL)) {
    common_free(pixels);
    return fl_set_error(FL_EFORMAT, "image %s: corrupt PNG: %s", path, img.message);
  }
  if (alpha)
    for (size_t i = 0; i < n; i++) memmove(pixels + 3 * i, pixels + 4 * i, 3);
  *rgb = pixels;
  *height = img.height;
  *width = img.width;
  return FL_OK;
}

fl_status fl_image_decode_file(const char *path, uint32_t min_side, uint8_t **rgb, uint32_t *height,
                               uint32_t *width) {
  if (!path || !rgb || !height || !width) return fl_set_error(FL_EINVAL, "fl_image_decode_file: NULL argument");
  uint8_t *data = NULL;
  size_t len = 0;
  fl_status s = read_whole(path, &data, &len);
  if (s != FL_OK) return s;
  static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
    s = decode_jpeg(path, data, len, min_side, rgb, height, width);
  else if (len >= 8 && memcmp(data, png_magic, 8) == 0)
    s = decode_png(path, data, len, rgb, height, width);
  else
    s = fl_set_error(FL_EFORMAT, "image %s is neither a JPEG nor a PNG (%s)", path,
                     len ? "unknown first bytes" : "empty file");
  common_free(data);
  return s;
}
