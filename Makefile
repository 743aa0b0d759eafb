# The front door. Each target installs what it is missing first.
BUILD ?= build
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
JOBS ?= $(shell nproc)

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 10
ASAN_BUILD ?= build-asan
SANITIZE ?= 1

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

# The tests, a short fuzz pass (FUZZ_SECONDS per target; 0 replays the fuzz
# corpora only), then the tests again under ASan + UBSan (SANITIZE=0 skips it).
test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -j 2
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh
	@if [ "$(SANITIZE)" != 0 ]; then $(MAKE) --no-print-directory sanitize; fi

bench: build
	@bench/run.sh $(BUILD)/bin

# The suite under AddressSanitizer + UBSan (a Debug build in ASAN_BUILD; any
# finding ends the process that made it, so the test fails). Left out: the
# exhaustion and stress suites, which hold environments and moatd to memory
# and latency limits that a sanitized build's 2-3x memory and time do not
# meet by design; they run in the normal build above. docs/SECURITY.md.
sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOAT_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
	  ctest --output-on-failure --timeout 600 -j 2 -LE stress -E '^security\.exhaustion$$'

# libFuzzer targets (clang) for the parsers of untrusted input: each runs
# FUZZ_SECONDS from fuzz/corpus/<name>/; docs/SECURITY.md, "Fuzzing".
fuzz: deps
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
