# The two Quick start commands. Both install what is missing (scripts/setup) and build with
# CMake into build/ (the sanitizer variant into build/asan/).
JOBS ?= $(shell nproc)
MASTER ?= local[*]

.PHONY: run test setup build build-asan bench clean

run: build
	./build/bin/flint submit --master '$(MASTER)' build/bin/logreg.so

test: build build-asan
	cd build && ctest --output-on-failure -j$(JOBS)
	cd build/asan && ctest --output-on-failure -j$(JOBS)

setup:
	@bash scripts/setup

build: setup
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build build -j$(JOBS)

# The sanitizer build leaves CUDA out: nvcc takes no -fsanitize, and CI has no GPU to test it.
build-asan: setup
	@cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DFLINT_SANITIZE=ON -DFLINT_CUDA=OFF >/dev/null
	@cmake --build build/asan -j$(JOBS)

bench: build
	./build/bin/bench_local

clean:
	rm -rf build
