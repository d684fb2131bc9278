#!/usr/bin/env bash
# test_install.sh BUILD_DIR SOURCE_DIR [--debian-flint]
#
# Installs the build into a temporary prefix (cmake --install), then, against that prefix
# only: checks the installed names and relative run paths, compiles every C example of
# README.md with one `cc ... $(pkg-config --cflags --libs ...)` line and runs it, runs a job
# on a local cluster through the installed flint command, and builds a small CMake project
# with find_package(FlintDataflow).
#
# --debian-flint: instead, with Debian's libflint-dev (FLINT, the number-theory library)
# installed, a program that uses both libraries, each through its own <flint/...> header and
# -l name, builds and runs. Exits 77 (skipped) when /usr/include/flint/flint.h is absent.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
mode=${3:-}

if [ "$mode" = --debian-flint ] && [ ! -e /usr/include/flint/flint.h ]; then
  echo "skipped: Debian's libflint-dev is not installed (/usr/include/flint/flint.h)"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/flint-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_install: $*" >&2; exit 1; }

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install failed"; }
pcdir=$(dirname "$(find "$prefix" -name flint-dataflow.pc)")
libdir=$(dirname "$pcdir")
export PKG_CONFIG_PATH=$pcdir
unset PKG_CONFIG_LIBDIR LD_LIBRARY_PATH FLINT_BIN FLINT_EXECUTABLE
# Programs built with pkg-config's flags carry no run path: the loader needs the prefix.
export LD_LIBRARY_PATH=$libdir
cc=${CC:-cc}
# A sanitizer build's libraries need the sanitizers' runtime first in every program.
read -r -a cflags <<<"${FLINT_TEST_CFLAGS:-}"

if [ "$mode" = --debian-flint ]; then
  cat >"$tmp/both.c" <<'C'
/* flint (the dataflow engine) and FLINT (number theory) in one program. */
#include <flint/flint.h> /* ours: -I PREFIX/include/flint-dataflow */
#include <flint/fmpz.h>  /* Debian's: /usr/include/flint/fmpz.h, which includes its flint.h */
#include <stdio.h>

int main(void) {
  fl_context *ctx;
  fl_dataset *nums;
  uint64_t n = 0;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK || fl_range(ctx, 0, 20, 1, 4, &nums) != FL_OK ||
      fl_count(nums, &n) != FL_OK) {
    fprintf(stderr, "%s\n", fl_last_error());
    return 1;
  }
  fl_dataset_free(nums);
  fl_context_close(ctx);
  fmpz_t f;
  fmpz_init(f);
  fmpz_fac_ui(f, n); /* 20! */
  char *s = fmpz_get_str(NULL, 10, f);
  printf("%llu %s\n", (unsigned long long)n, s);
  flint_free(s);
  fmpz_clear(f);
  return 0;
}
C
  # shellcheck disable=SC2046
  "$cc" "${cflags[@]}" -o "$tmp/both" "$tmp/both.c" $(pkg-config --cflags --libs flint-dataflow) -lflint -lgmp ||
    fail "a program using both libraries did not build"
  out=$("$tmp/both") || fail "a program using both libraries failed"
  [ "$out" = "20 2432902008176640000" ] || fail "a program using both libraries printed '$out'"
  # Not `ldd | grep -q`: grep's early exit would fail the pipeline (pipefail) by SIGPIPE.
  libs=$(ldd "$tmp/both")
  grep -q "$libdir/libflint-dataflow.so.0" <<<"$libs" || fail "not linked with the installed libflint-dataflow"
  grep -q "libflint.so.[0-9]" <<<"$libs" || { echo "$libs"; fail "not linked with Debian's libflint"; }
  echo "ok: flint-dataflow and Debian's FLINT in one program: $out"
  exit 0
fi

# Installed names, SONAMEs and relative run paths.
for f in "$libdir"/libflint-dataflow{,-ml,-gpu}.so "$prefix"/bin/flint "$prefix"/bin/flint-train \
    "$prefix"/include/flint-dataflow/flint/flint.h "$pcdir"/flint-dataflow{,-ml,-gpu}.pc \
    "$libdir"/cmake/FlintDataflow/FlintDataflowConfig.cmake; do
  [ -e "$f" ] || fail "$f was not installed"
done
[ ! -e "$prefix/include/flint" ] || fail "headers installed in include/flint, Debian's FLINT's folder"
ls "$libdir"/libflint.so* >/dev/null 2>&1 && fail "a libflint.so was installed, Debian's FLINT's name"
for f in "$libdir"/libflint-dataflow{,-ml,-gpu}.so.0 "$prefix"/bin/flint "$prefix"/bin/flint-train; do
  [ -e "$f" ] || fail "$f is missing (SONAME link)"
  dyn=$(readelf -d "$f")
  if grep -q "$build" <<<"$dyn"; then fail "$f has a run path into the build tree"; fi
  grep -Eq 'R(UN)?PATH.*\$ORIGIN' <<<"$dyn" || fail "$f has no \$ORIGIN run path"
done
[[ $(readelf -d "$libdir/libflint-dataflow.so") == *"Library soname: [libflint-dataflow.so.0]"* ]] ||
  fail "libflint-dataflow has no SONAME libflint-dataflow.so.0"

# Every C example of README.md, with one pkg-config line each.
awk -v dir="$tmp" '/^```c$/ {n++; f = sprintf("%s/readme%d.c", dir, n); on = 1; next}
                   /^```/ {on = 0} on {print > f}' "$src/README.md"
examples=("$tmp"/readme*.c)
[ -e "${examples[0]}" ] || fail "no C example found in README.md"
for c in "${examples[@]}"; do
  mods=flint-dataflow
  grep -q '<flint/ml.h>' "$c" && mods="$mods flint-dataflow-ml"
  grep -q '<flint/gpu.h>\|<flint/train.h>' "$c" && mods="$mods flint-dataflow-gpu"
  bin=${c%.c}
  # shellcheck disable=SC2046,SC2086
  "$cc" "${cflags[@]}" -Wall -Werror -o "$bin" "$c" $(pkg-config --cflags --libs $mods) ||
    fail "README's example $(basename "$c") does not compile (see above)"
  (cd "$tmp" && timeout 60 "$bin" >"$bin.out" 2>&1) || { cat "$bin.out"; fail "README's example $(basename "$c") failed"; }
  echo "ok: README example $(basename "$c") ($mods): $(tail -n 1 "$bin.out")"
done

# A job on a local cluster through the installed command: flint finds libflint through its
# run path, and libflint finds the flint command for the cluster's processes beside it.
cat >"$tmp/job.c" <<'C'
#include <flint/flint.h>
#include <stdio.h>
int flint_main(fl_context *ctx, int argc, char **argv) {
  fl_dataset *d;
  uint64_t n;
  if (fl_range(ctx, 0, 1000, 1, 4, &d) != FL_OK || fl_count(d, &n) != FL_OK) return 1;
  fl_dataset_free(d);
  printf("count %llu\n", (unsigned long long)n);
  return n == 1000 ? 0 : 1;
}
C
# shellcheck disable=SC2046
"$cc" "${cflags[@]}" -shared -fPIC -o "$tmp/job.so" "$tmp/job.c" $(pkg-config --cflags --libs flint-dataflow)
(unset LD_LIBRARY_PATH; cd "$tmp" && timeout 60 "$prefix/bin/flint" submit --master 'local-cluster[1,1,256]' "$tmp/job.so") \
  >"$tmp/job.out" 2>&1 || { cat "$tmp/job.out"; fail "the installed flint could not run a job on a local cluster"; }
grep -q 'count 1000' "$tmp/job.out" || { cat "$tmp/job.out"; fail "the job's output is missing"; }
echo "ok: installed flint submit on local-cluster"

# find_package(FlintDataflow) from a CMake project.
mkdir -p "$tmp/proj"
cp "${examples[0]}" "$tmp/proj/main.c"
cat >"$tmp/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(uses_flint LANGUAGES C)
find_package(FlintDataflow 0.1 REQUIRED)
add_executable(main main.c)
target_link_libraries(main PRIVATE FlintDataflow::flint)
CM
(unset LD_LIBRARY_PATH
 cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="${FLINT_TEST_CFLAGS:-}" >"$tmp/proj.log" 2>&1 &&
   cmake --build "$tmp/proj/build" >>"$tmp/proj.log" 2>&1 && timeout 60 "$tmp/proj/build/main" >>"$tmp/proj.log" 2>&1) ||
  { cat "$tmp/proj.log"; fail "a CMake project with find_package(FlintDataflow) failed"; }
echo "ok: find_package(FlintDataflow)"
