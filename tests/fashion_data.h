/* fashion_data.h: where the trainer tests find Fashion-MNIST, and the skip when it is not
 * there (scripts/setup installs it; a machine without it reports those tests skipped). */
#ifndef FLINT_TESTS_FASHION_DATA_H
#define FLINT_TESTS_FASHION_DATA_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>

#define DATA_DIR "/usr/share/datasets/fashion-mnist"

static inline bool have_data(void) {
  struct stat st;
  return stat(DATA_DIR "/train-images-idx3-ubyte", &st) == 0 || stat(DATA_DIR "/train-images-idx3-ubyte.gz", &st) == 0;
}
#define NEED_DATA()                                                                          \
  do {                                                                                       \
    if (!have_data()) {                                                                      \
      fprintf(stderr, "skipped: Fashion-MNIST is not in " DATA_DIR "\n");                    \
      skip();                                                                                \
    }                                                                                        \
  } while (0)

#endif /* FLINT_TESTS_FASHION_DATA_H */
