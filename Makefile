# The front door. Each target installs what it is missing first.
BUILD ?= build
# -O2 with line tables and function names only (-g1): backtraces name the
# line, and a build takes a third less time than with full -g.
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
JOBS ?= $(shell nproc)

FUZZ_SECONDS ?= 10
ASAN_BUILD ?= build-asan
SANITIZE ?= 1

.PHONY: all deps build run test test-microvm test-container bench sanitize fuzz asan-configure format clean install \
  deb image

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
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -j 2 -LE microvm_slow
	@$(MAKE) --no-print-directory fuzz
	@if [ "$(SANITIZE)" != 0 ]; then $(MAKE) --no-print-directory sanitize; fi

# Every microVM test (TCG here: slow), the slow tier that `make test`
# leaves out included: docs/MICROVM.md, "Tests".
test-microvm: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 600 -j 2 -R '[Mm]icro[Vv]m|KvmProbe|HelperRoot'
	@cd $(BUILD) && MOAT_ESCAPE_ISOLATION=microvm ctest --output-on-failure --timeout 600 -j 2 -R '^security\.Escape\.'

bench: build
	@bench/run.sh $(BUILD)/bin

# The binaries, the board, man pages, completions, docs, the systemd unit
# and /etc/default/moatd under DESTDIR/PREFIX (docs/INSTALL.md).
PREFIX ?= /usr/local
install: build
	@BUILD=$(BUILD) PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) scripts/install.sh

# A Debian package (moat_VERSION_ARCH.deb, here): apt install ./moat_*.deb.
deb: build
	@BUILD=$(BUILD) scripts/make-deb.sh

# moatd's container image from that package (packaging/Dockerfile), with
# docker or podman: moat:VERSION and moat:latest. BASE=IMAGE for another
# Debian 12 base than debian:bookworm-slim.
image: build
	@BUILD=$(BUILD) scripts/make-image.sh

# The image built with podman on a base debootstrap makes (no registry
# needed) and moatd from it serving an environment: root, not in `make test`
# (the package mirror: a minute or two). docs/INSTALL.md, "In a container".
test-container: build
	@command -v podman >/dev/null && command -v debootstrap >/dev/null || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman debootstrap >/dev/null
	@tests/packaging/container_test.sh $(BUILD)

# One clang build in ASAN_BUILD serves the sanitized suite and the fuzz
# targets: AddressSanitizer + UBSan (any finding ends the process that made
# it, so the test fails) and libFuzzer's coverage instrumentation. -O1 with
# line tables compiles fast, runs the suite faster than -O0 and still names
# the line of a finding. No benchmarks in it.
asan-configure: deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE= \
	  -DMOAT_SANITIZE=ON -DMOAT_FUZZ=ON -DMOAT_BENCHMARKS=OFF \
	  "-DCMAKE_C_FLAGS=-O1 -gline-tables-only" "-DCMAKE_CXX_FLAGS=-O1 -gline-tables-only" >/dev/null

# The suite under ASan + UBSan. Left out: the exhaustion and stress suites,
# which hold environments and moatd to memory and latency limits that a
# sanitized build's 2-3x memory and time do not meet by design; they run in
# the normal build above, and the structure checks, which build nothing.
# The board's browser tests measure 50 cards there (100 in the release suite).
# And the microVM guest tests: a guest boots a static moat-init, which a
# sanitized build does not make (the host side's unit tests run sanitized).
# docs/SECURITY.md, "Sanitizers".
sanitize: asan-configure
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
	  MOAT_BOARD_CARDS=50 ctest --output-on-failure --timeout 600 -j 2 -LE 'stress|structure|microvm_slow|packaging' -E '^security\.exhaustion$$|^integration\.MicroVm|^api\.openapi_conformance_microvm$$|^egress\.microvm$$'

# libFuzzer targets for the parsers of untrusted input, built in ASAN_BUILD:
# each runs FUZZ_SECONDS from fuzz/corpus/<name>/; docs/SECURITY.md, "Fuzzing".
fuzz: asan-configure
	@FUZZ_BUILD=$(ASAN_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

# Lays the C++ sources out as .clang-format says (clang-format 14, Debian
# 12's); tests/structure/format_test.sh fails the suite on any that differ.
format: deps
	@git ls-files 'src/*.cc' 'src/*.h' 'tests/*.cc' 'tests/*.h' 'bench/*.cc' 'fuzz/*.cc' | xargs clang-format-14 -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
