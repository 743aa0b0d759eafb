# The front door. Each target installs what it is missing first.
BUILD ?= build
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
JOBS ?= $(shell nproc)

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 10

.PHONY: all deps build run test bench sanitize fuzz clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main job on its defaults: an environment that runs commands.
run: build
	@scripts/demo.sh $(BUILD)/bin

# The tests, then a short fuzz pass (FUZZ_SECONDS per target; 0 replays the
# fuzz corpora only).
test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -j 2
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

bench: build
	@bench/run.sh $(BUILD)/bin

sanitize:
	@$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DMOAT_SANITIZE=ON"

# libFuzzer targets (clang) for the parsers of untrusted input: each runs
# FUZZ_SECONDS from fuzz/corpus/<name>/; docs/SECURITY.md, "Fuzzing".
fuzz: deps
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

clean:
	rm -rf $(BUILD) build-asan $(FUZZ_BUILD)
