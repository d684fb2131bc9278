# The two Quick start commands. Both install what is missing (scripts/setup) and build with
# CMake into build/ (the sanitizer variant into build/asan/), warnings as errors. The build's
# output goes to build/build.log (build/asan/build.log), shown only where it failed.
JOBS ?= $(shell nproc)
MASTER ?= local[*]
PREFIX ?= /usr/local

.PHONY: run test setup build build-asan bench install clean

run: build
	./build/bin/flint submit --master '$(MASTER)' build/bin/logreg.so

test: build build-asan
	cd build && ctest --output-on-failure -j$(JOBS)
	cd build/asan && ctest --output-on-failure -j$(JOBS)

setup:
	@bash scripts/setup

# quiet-build DIR CMAKE-ARGS: configures and builds into DIR, its output in DIR/build.log.
define quiet-build
	@mkdir -p $(1)
	@echo "build: $(1) (log: $(1)/build.log)"
	@{ cmake -S . -B $(1) $(2) && cmake --build $(1) -j$(JOBS); } >$(1)/build.log 2>&1 || \
	  { tail -n 40 $(1)/build.log; echo "build: failed; the whole log is $(1)/build.log"; exit 1; }
endef

build: setup
	$(call quiet-build,build,-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLINT_WERROR=ON)

# The sanitizer build leaves CUDA out: nvcc takes no -fsanitize, and CI has no GPU to test it.
build-asan: setup
	$(call quiet-build,build/asan,-DCMAKE_BUILD_TYPE=Debug -DFLINT_SANITIZE=ON -DFLINT_CUDA=OFF -DFLINT_WERROR=ON)

# Installs build/ into PREFIX (libraries, headers, commands, pkg-config and CMake files).
install: build
	cmake --install build --prefix '$(PREFIX)'

bench: build
	./build/bin/bench_local

clean:
	rm -rf build
