# performer: build, test, benchmark.
#
#   make            library (static and shared) and the `performer` tool
#   make test       every test, then every test again under ASan + UBSan
#   make demo       the one-minute answer: exact vs FAVOR+ time, memory and error against L
#   make bench      the benchmarks (medians, ratios to this machine's sgemm)
#   make bench-train  a training step of the byte LM against the context, exact and FAVOR+:
#                   tokens/s, peak memory, fraction of the FMA peak (minutes; not in `make test`)
#   make asan       the tests under AddressSanitizer and UndefinedBehaviorSanitizer only
#   make test-aarch64  a cross build for aarch64 and its unit tests under qemu-user (a subset;
#                   skips, saying why, without the cross compiler, qemu or arm64 libraries)
#   make fuzz       the libFuzzer targets of the file readers (clang): regressions, then
#                   FUZZ_TIME seconds each (tests/fuzz/)
#   make install    header, libraries, tool, performer.pc and man page under PREFIX (/usr/local),
#                   and where mpicc is, the MPI library, its header and .pc and performer-mpi;
#                   DESTDIR stages them elsewhere; make uninstall removes them
#
# Out-of-tree: objects go to $(BUILD) (default build/). Sources are found by wildcard, so a new
# file in src/, tools/, tests/ or bench/ needs no edit here.

BUILD    ?= build
CC       ?= cc
OPT      ?= -O2
# The target, as the compiler names it: its CPU (x86_64, aarch64, ...) picks which vector kernels
# are compiled, its multiarch triplet (x86_64-linux-gnu, aarch64-linux-gnu) the BLAS folders.
MACHINE  := $(shell $(CC) -dumpmachine 2>/dev/null)
ARCH     := $(firstword $(subst -, ,$(MACHINE)))
TRIPLET  := $(or $(shell $(CC) -print-multiarch 2>/dev/null),$(MACHINE))
# BLAS: Debian's OpenMP build of OpenBLAS for the target (why that build: below, at LDLIBS), in
# its multiarch folders; elsewhere, whatever pkg-config's openblas names (PKG_CONFIG_LIBDIR picks
# a cross target's). BLAS_DIR and BLAS_INC on the command line override both.
BLAS_MA  := $(wildcard /usr/lib/$(TRIPLET)/openblas-openmp/libopenblas.so)
BLAS_DIR ?= $(if $(BLAS_MA),/usr/lib/$(TRIPLET)/openblas-openmp,$(patsubst -L%,%,$(filter -L%,\
              $(shell pkg-config --libs-only-L openblas 2>/dev/null))))
BLAS_INC ?= $(if $(BLAS_MA),/usr/include/$(TRIPLET)/openblas-openmp,$(patsubst -I%,%,$(filter \
              -I%,$(shell pkg-config --cflags-only-I openblas 2>/dev/null))))
# (none found: the compiler's own folders, where a BLAS in /usr/lib or /usr/include is found)
ifneq ($(strip $(BLAS_DIR)),)
BLAS_LIBS = -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR)
endif

WARN     = -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wno-unknown-pragmas -Werror=implicit-function-declaration
CFLAGS  ?= $(OPT) -g
ALLCFLAGS = -std=c11 -D_POSIX_C_SOURCE=200809L $(CFLAGS) $(WARN) -fPIC -fopenmp \
            -Iinclude -Isrc $(addprefix -I,$(BLAS_INC)) $(EXTRA_CFLAGS)
# OpenBLAS's OpenMP build: the library runs its own threads (OpenMP) around single-threaded BLAS
# calls (a call from inside a parallel region runs on one thread; pf_blas_pin covers a region of
# one), so BLAS never oversubscribes the cores and results do not depend on threads. It has no
# threads of its own. Not the pthread build: its worker threads, started when it loads, spin in
# sched_yield for up to 0.1 s whatever openblas_set_num_threads says, on the cores the library's
# threads run on (41% of a `performer attn` call's samples at L = 4096 on an Intel family 6 model
# 207). Not the serial build: Debian's is compiled without locking, and two threads calling its
# sgemm at once can share one packing buffer (wrong results); the OpenMP build locks each buffer.
LDLIBS   = $(BLAS_LIBS) -lopenblas -fopenmp -lz -lm $(EXTRA_LDLIBS)

# Vector kernels (src/simd/simd_ISA.c) only for the target's instruction sets: AVX2 and AVX-512
# on x86-64, NEON on aarch64, none elsewhere (the portable simd_ref.c serves every CPU).
SIMD_ISA_x86_64  = avx2 avx512
SIMD_ISA_aarch64 = neon
SIMD_ISA  = $(SIMD_ISA_$(ARCH))
SIMD_SKIP = $(filter-out src/simd/simd_ref.c $(SIMD_ISA:%=src/simd/simd_%.c),\
              $(wildcard src/simd/simd_*.c))
LIB_SRC   = $(filter-out $(SIMD_SKIP),\
              $(sort $(wildcard src/*.c src/favor/*.c src/simd/*.c src/io/*.c src/model/*.c)))
# The tool: tools/*.c, compiled once, linked into performer with tools/mpi/alone.c (one process)
# and into performer-mpi with the rest of tools/mpi/ (MPI: below).
TOOL_SRC  = $(sort $(wildcard tools/*.c))
TEST_SRC  = $(sort $(wildcard tests/test_*.c))
BENCH_SRC = $(sort $(wildcard bench/*.c))

LIB_OBJ   = $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  = $(TOOL_SRC:%.c=$(BUILD)/%.o)
TOOL_ALONE_OBJ = $(BUILD)/tools/mpi/alone.o
TESTS     = $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCHES   = $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

# The version is the header's PF_VERSION_MAJOR.MINOR.PATCH, read from it (one place). The shared
# library's soname carries the major number: a program linked against 0.1 runs on any later 0.x.
VERSION  := $(shell sed -n 's/^.define PF_VERSION_[A-Z]* *\([0-9][0-9]*\).*/\1/p' \
              include/performer.h | paste -sd. -)
SOVERSION = $(firstword $(subst ., ,$(VERSION)))
SONAME    = libperformer.so.$(SOVERSION)

STATIC = $(BUILD)/libperformer.a
SHARED = $(BUILD)/libperformer.so
SHARED_REAL = $(BUILD)/libperformer.so.$(VERSION)
TOOL   = $(BUILD)/performer
MAN    = $(BUILD)/performer.1

.PHONY: all setup test test-fast asan demo results bench bench-train bench-targets clean format \
        install uninstall install-files \
        fuzz fuzz-regress fuzz-corpus
all: $(STATIC) $(SHARED) $(TOOL) $(MAN)

setup:
	@sh scripts/setup.sh

# Library sources see PF_BUILDING_LIBRARY (exported symbols) and hide everything else.
$(BUILD)/src/%.o: src/%.c include/performer.h $(wildcard src/*.h src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -DPF_BUILDING_LIBRARY -fvisibility=hidden $(SIMD_FLAGS) -c $< -o $@

# Kernels for one instruction set are compiled for it alone and chosen at run time (cpuid on
# x86-64; NEON is part of every aarch64 CPU, so simd_neon.c needs no flag).
SIMD_FLAGS_avx2   = -mavx2 -mfma
SIMD_FLAGS_avx512 = -mavx512f -mavx512dq -mavx2 -mfma
$(BUILD)/src/simd/%_avx2.o: SIMD_FLAGS = $(SIMD_FLAGS_avx2)
$(BUILD)/src/simd/%_avx512.o: SIMD_FLAGS = $(SIMD_FLAGS_avx512)

# The tool is a user of the library like any other: the public headers only (no -Isrc).
TOOL_CFLAGS = $(filter-out -Isrc,$(ALLCFLAGS)) -Itools
$(BUILD)/tools/%.o: tools/%.c include/performer.h $(wildcard tools/*.h tools/mpi/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(TOOL_CFLAGS) -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# libperformer.so.X.Y.Z, named by its soname libperformer.so.X (what a program records and the
# dynamic linker looks for), and libperformer.so (what -lperformer finds): two links.
$(SHARED_REAL): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS)

$(BUILD)/$(SONAME): $(SHARED_REAL)
	ln -sf $(notdir $<) $@

$(SHARED): $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

# The man page is the tool's --help and every command's, in roff.
$(MAN): $(TOOL) scripts/make_man.py
	/usr/bin/python3 scripts/make_man.py $(TOOL) >$@.tmp && mv $@.tmp $@

# build/performer links the static library: it runs from anywhere, where the tests copy it too.
# The installed one links the shared library (make install links it again, for its folders).
$(TOOL): $(TOOL_OBJ) $(TOOL_ALONE_OBJ) $(STATIC)
	$(CC) -o $@ $(TOOL_OBJ) $(TOOL_ALONE_OBJ) $(STATIC) $(LDLIBS)

# Tests link the static library, so they can reach the internal references in src/*.h.
$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itests -o $@ $< $(STATIC) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Ibench -o $@ $< $(STATIC) $(LDLIBS)

# The whole suite: the optimised build, then two lanes side by side: the sanitizer build and its
# tests; the aarch64 build under qemu, then the fuzz targets' regression pass and 20 s of fuzzing
# each (the tests run one at a time, mostly on one thread, so each lane keeps about one core
# busy; their output is shown when both end). Builds take JOBS compilers at a time (the cores
# this process may use). About 16 minutes on two cores; CI's budget is 20.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: setup
	@$(MAKE) --no-print-directory -j$(JOBS) test-fast; r1=$$?; \
	mkdir -p build-asan $(AARCH64_BUILD) $(FUZZ_BUILD); \
	rm -f build-asan/test-counts $(AARCH64_BUILD)/test-counts $(FUZZ_BUILD)/test-counts; \
	echo "two lanes side by side: asan; aarch64, then fuzz (logs: build-asan/stage.log," \
	  "$(AARCH64_BUILD)/stage.log, $(FUZZ_BUILD)/stage.log)"; \
	{ $(MAKE) --no-print-directory -j$(JOBS) asan >build-asan/stage.log 2>&1; \
	  echo $$? >build-asan/stage.rc; } & \
	{ $(MAKE) --no-print-directory test-aarch64 >$(AARCH64_BUILD)/stage.log 2>&1; \
	  echo $$? >$(AARCH64_BUILD)/stage.rc; \
	  $(MAKE) --no-print-directory -j$(JOBS) fuzz FUZZ_TIME=20 >$(FUZZ_BUILD)/stage.log 2>&1; \
	  echo $$? >$(FUZZ_BUILD)/stage.rc; } & \
	wait; cat build-asan/stage.log $(AARCH64_BUILD)/stage.log $(FUZZ_BUILD)/stage.log; \
	r2=$$(cat build-asan/stage.rc 2>/dev/null || echo 1); \
	r3=$$(cat $(FUZZ_BUILD)/stage.rc 2>/dev/null || echo 1); \
	r4=$$(cat $(AARCH64_BUILD)/stage.rc 2>/dev/null || echo 1); \
	set -- $$(cat $(BUILD)/test-counts 2>/dev/null || echo 0 1) \
	       $$(cat build-asan/test-counts 2>/dev/null || echo 0 1) \
	       $$(cat $(FUZZ_BUILD)/test-counts 2>/dev/null || echo 0 1) \
	       $$(cat $(AARCH64_BUILD)/test-counts 2>/dev/null || echo 0 0); \
	echo "all: $$(($$1 + $$3 + $$5 + $$7)) passed, $$(($$2 + $$4 + $$6 + $$8)) failed"; \
	[ $$r1 -eq 0 ] && [ $$r2 -eq 0 ] && [ $$r3 -eq 0 ] && [ $$r4 -eq 0 ]

TEST_LABEL ?= release
SIMD_PATHS ?= avx2 ref
test-fast: all $(TESTS)
	@SIMD_PATHS="$(SIMD_PATHS)" sh tests/run.sh $(BUILD) "$(TEST_LABEL)"

asan:
	@$(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined \
	  -fno-omit-frame-pointer" EXTRA_LDLIBS="-fsanitize=address,undefined" \
	  TEST_LABEL=asan SIMD_PATHS= CUDA=0 test-fast

# Fuzzing (tests/fuzz/): libFuzzer targets for the .npy, safetensors, checkpoint and FASTA/text
# readers, built by clang into $(FUZZ_BUILD) with ASan and UBSan. The library's sources are
# instrumented for coverage (fuzzer-no-link) and built without OpenMP: one thread per input, so a
# finding replays the same way (and the build without OpenMP is exercised too).
#   make fuzz          the regression pass (every seed and every file in tests/fuzz/regress/),
#                      then each target for FUZZ_TIME seconds, FUZZ_JOBS at a time; any finding
#                      fails (tests/fuzz/run.sh says what counts); FUZZ_ONLY="fuzz_npy ..." picks
#                      targets
#   make fuzz-regress  the regression pass alone
#   make fuzz-corpus   remakes the committed seed corpus, tests/fuzz/corpus/
FUZZ_BUILD   = build-fuzz
FUZZ_CC     ?= clang
FUZZ_TIME   ?= 60
FUZZ_JOBS   ?= 2
# Line tables are all the stack traces need, and UBSan stops at its first report through
# halt_on_error (tests/fuzz/harness.c sets it) rather than -fno-sanitize-recover: with full -g or
# that flag, clang takes minutes on simd_avx512.c under the three instrumentations (20 s so).
FUZZ_CFLAGS  = -std=c11 -D_POSIX_C_SOURCE=200809L -O1 -gline-tables-only -fno-omit-frame-pointer \
               $(WARN) -fsanitize=address,undefined -Iinclude -Isrc $(addprefix -I,$(BLAS_INC))
FUZZ_LDLIBS  = $(BLAS_LIBS) -lopenblas -lz -lm
FUZZ_LIB     = $(FUZZ_BUILD)/libperformer.a
FUZZ_TARGETS = $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(wildcard tests/fuzz/fuzz_*.c))

$(FUZZ_BUILD)/src/%.o: src/%.c include/performer.h $(wildcard src/*.h src/*/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -DPF_BUILDING_LIBRARY \
	  -fvisibility=hidden $(SIMD_FLAGS) -c $< -o $@
$(FUZZ_BUILD)/src/simd/%_avx2.o: SIMD_FLAGS = $(SIMD_FLAGS_avx2)
$(FUZZ_BUILD)/src/simd/%_avx512.o: SIMD_FLAGS = $(SIMD_FLAGS_avx512)

$(FUZZ_LIB): $(LIB_SRC:%.c=$(FUZZ_BUILD)/%.o)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/harness.c tests/fuzz/harness.h $(FUZZ_LIB)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Itests/fuzz -o $@ $< tests/fuzz/harness.c \
	  $(FUZZ_LIB) $(FUZZ_LDLIBS)

$(FUZZ_BUILD)/make_corpus: tests/fuzz/make_corpus.c $(FUZZ_LIB)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -o $@ $< $(FUZZ_LIB) $(FUZZ_LDLIBS)

fuzz: setup $(FUZZ_TARGETS)
	@FUZZ_TIME=$(FUZZ_TIME) FUZZ_JOBS=$(FUZZ_JOBS) FUZZ_ONLY="$(FUZZ_ONLY)" \
	  sh tests/fuzz/run.sh $(FUZZ_BUILD) all

fuzz-regress: $(FUZZ_TARGETS)
	@FUZZ_ONLY="$(FUZZ_ONLY)" sh tests/fuzz/run.sh $(FUZZ_BUILD) regress

fuzz-corpus: $(FUZZ_BUILD)/make_corpus
	rm -rf tests/fuzz/corpus
	$(FUZZ_BUILD)/make_corpus tests/fuzz/corpus

demo: setup all
	$(TOOL) demo

# The approximation experiments' figures and the CSV files behind them, in docs/figures/ (about
# a minute on two cores; the same CSV at any RESULTS_THREADS). The language-model figures take
# hours and are not remade here: docs/results.md names the script behind each.
RESULTS_THREADS ?= 0
results: setup all
	$(TOOL) approx --all --threads $(RESULTS_THREADS) --out docs/figures
	$(TOOL) approx real --threads $(RESULTS_THREADS) --out docs/figures
	@echo "results: made docs/figures/NAME.csv and NAME.png for NAME in ortho maps kernel" \
	      "norms estimators length real"

# Tables on stdout; CSVs and plots in $(BUILD)/bench/ (docs/figures/ holds a committed run).
# They run on the OpenBLAS kernels the tool runs on: the set it chose when OpenBLAS's own choice
# is a fallback (as tests/run.sh does).
bench: setup all $(BENCHES)
	@core=$$($(TOOL) --version | \
	  sed -n 's/.*OpenBLAS kernels: \([A-Za-z0-9_]*\), set by performer over.*/\1/p'); \
	if [ -z "$${OPENBLAS_CORETYPE-}" ] && [ -n "$$core" ]; then export OPENBLAS_CORETYPE=$$core; fi; \
	$(BUILD)/bench/bench_peak && echo && \
	echo "$(BUILD)/bench/bench_attn --csv $(BUILD)/bench/attn.csv" && \
	$(BUILD)/bench/bench_attn --csv $(BUILD)/bench/attn.csv && \
	if [ -x $(BUILD)/bench/bench_decode ]; then \
	  $(BUILD)/bench/bench_decode --csv $(BUILD)/bench/decode.csv; fi && \
	echo && $(BUILD)/bench/bench_serve
	/usr/bin/python3 scripts/plot_bench.py $(BUILD)/bench/attn.csv $(BUILD)/bench/decode.csv \
	  $(BUILD)/bench
	/usr/bin/python3 bench/bench_cli.py $(TOOL)
	/usr/bin/python3 bench/bench_python.py --build $(BUILD)

# A training step (forward, backward, AdamW) of the language model, exact and FAVOR+, at contexts
# 256 to 32768 for the same tokens a step: table on stdout, CSV and figure in $(BUILD)/bench/
# (docs/bench_train.txt and docs/figures/train_context.* hold a committed run). BENCH_TRAIN_ARGS
# adds flags (bench_train --help), e.g. BENCH_TRAIN_ARGS=--quick.
bench-train: setup all $(BUILD)/bench/bench_train
	@core=$$($(TOOL) --version | \
	  sed -n 's/.*OpenBLAS kernels: \([A-Za-z0-9_]*\), set by performer over.*/\1/p'); \
	if [ -z "$${OPENBLAS_CORETYPE-}" ] && [ -n "$$core" ]; then export OPENBLAS_CORETYPE=$$core; fi; \
	$(BUILD)/bench/bench_train --csv $(BUILD)/bench/train.csv $(BENCH_TRAIN_ARGS)
	/usr/bin/python3 scripts/plot_train_bench.py $(BUILD)/bench/train.csv \
	  $(BUILD)/bench/train_context.png $(BUILD)/bench/train_context.md

# This CPU against the library's speed targets (bench/targets.py): FAVOR+ forward, causal over
# bidirectional, the kept-feature backward, decoding, training and exact attention, each as a
# fraction of the FMA peak, in one table. TARGETS_ARGS adds flags (--quick, --md FILE);
# PF_SIMD=avx2 measures the AVX2 kernels on an AVX-512 CPU.
bench-targets: setup all $(BUILD)/bench/bench_attn $(BUILD)/bench/profile_favor \
	  $(BUILD)/bench/bench_decode $(BUILD)/bench/bench_train
	/usr/bin/python3 bench/targets.py --build $(BUILD) $(TARGETS_ARGS)

# make install [PREFIX=/usr/local] [DESTDIR=stage]: PREFIX is where the files will live (it is
# written into performer.pc); DESTDIR, if given, is prepended to every path, for packaging. Run
# as root without DESTDIR it also runs ldconfig, so that the dynamic linker finds
# libperformer.so.0 at once (LIBDIR must be on its path: /usr/local/lib is, on Debian).
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
MANDIR       ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
CMAKEDIR     ?= $(LIBDIR)/cmake/performer
LDCONFIG     ?= ldconfig
# ldconfig runs (as root, without DESTDIR) only where it would help: when LIBDIR is one of the
# folders the dynamic linker searches (ldconfig -v -N -X lists them, changing nothing); for
# any other LIBDIR the install says how programs find the library instead.
LD_FOLDERS    = $(shell /sbin/ldconfig -v -N -X 2>/dev/null | sed -n 's|^\(/[^:]*\):.*|\1|p')
LD_SEARCHED   = $(filter $(patsubst %/,%,$(LIBDIR)),$(LD_FOLDERS))
LD_AFTER      = if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" -eq 0 ]; then \
	  if [ -n "$(LD_SEARCHED)" ]; then echo $(LDCONFIG); $(LDCONFIG); else \
	  echo "$(LIBDIR) is not on the dynamic linker's path, so no ldconfig: link programs with" \
	    "-Wl,-rpath,$(LIBDIR) (README, Install) or set LD_LIBRARY_PATH"; fi; fi
INSTALL_MPI_WHAT = libperformer_mpi, performer-mpi, performer_mpi.h and performer_mpi.pc (mpicc \
  was found)
INSTALL_CUDA_WHAT = libperformer_cuda, performer_cuda.h and performer_cuda.pc (nvcc was found)
INSTALL_WHAT  = the performer tool, libperformer (.a, .so), performer.h, performer.pc, the \
  CMake package and the man page$(if $(MPICC),; $(INSTALL_MPI_WHAT))$(if \
  $(filter 1,$(CUDA)),; $(INSTALL_CUDA_WHAT))
# performer_cuda.pc's Libs name the CUDA runtime too: performer_cuda.h's calls take its types
# (cudaStream_t) and a program using them allocates with it.
# performer.pc: Libs for the shared library (it records its own BLAS, OpenMP, zlib and libm);
# Libs.private what the static one needs on top, from LDLIBS (-fopenmp as the library it adds).
PC_LIBS_PRIVATE = $(strip $(patsubst -fopenmp,-lgomp,$(LDLIBS)))
# The installed performer and performer-mpi link libperformer.so.MAJOR (and libperformer_mpi's),
# linked at install for the install's folders: their runpath is LIBDIR as seen from BINDIR
# ($ORIGIN/../lib for the usual folders, so a staged or moved tree runs where it lies), then
# LIBDIR itself (for a copy of the tool elsewhere).
INSTALL_TOOL_DIR = $(BUILD)/install
TOOL_RUNPATH = -Wl,-rpath,'$$ORIGIN/$(call pf_relative,$(BINDIR),$(LIBDIR))' -Wl,-rpath,$(LIBDIR)
PC_DIR = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
INSTALLED = $(BINDIR)/performer $(INCLUDEDIR)/performer.h $(LIBDIR)/libperformer.a \
            $(LIBDIR)/libperformer.so.$(VERSION) $(LIBDIR)/$(SONAME) $(LIBDIR)/libperformer.so \
            $(PKGCONFIGDIR)/performer.pc $(MANDIR)/man1/performer.1 \
            $(CMAKEDIR)/performerConfig.cmake $(CMAKEDIR)/performerConfigVersion.cmake
# The CMake package: cmake/*.cmake.in with these values. Its paths are relative to CMAKEDIR, so
# it works from wherever the install is found (DESTDIR staged, or moved); performer::performer_mpi
# and performer::performer_cuda are defined only where this install puts those libraries. The
# version file answers as CMake's SameMajorVersion does, the soname's promise (0.1 runs on 0.x).
pf_relative = $(shell realpath -m -s --relative-to=$(1) $(2))
CMAKE_SUBST = -e 's|@VERSION@|$(VERSION)|g' -e 's|@SOVERSION@|$(SOVERSION)|g' \
  -e 's|@CMAKEDIR_TO_LIBDIR@|$(call pf_relative,$(CMAKEDIR),$(LIBDIR))|g' \
  -e 's|@CMAKEDIR_TO_INCLUDEDIR@|$(call pf_relative,$(CMAKEDIR),$(INCLUDEDIR))|g' \
  -e 's|@HAVE_MPI@|$(if $(MPICC),1,0)|g' -e 's|@HAVE_CUDA@|$(if $(filter 1,$(CUDA)),1,0)|g' \
  -e 's|@STATIC_LIBS@|$(subst $(pf_space),;,$(PC_LIBS_PRIVATE))|g' \
  -e 's|@SIZEOF_VOID_P@|$(shell echo __SIZEOF_POINTER__ | $(CC) -E -P -x c - | tail -n 1)|g'
# Where mpicc was found, the MPI library and the tool's MPI build too (make uninstall removes
# them in any case). performer_mpi.pc requires performer and the MPI implementation's own .pc
# (Open MPI's ompi-c, MPICH's mpich) for mpi.h, which performer_mpi.h includes, and -lmpi;
# without one, it carries mpicc's flags (Open MPI's --showme).
INSTALLED_MPI = $(BINDIR)/performer-mpi $(INCLUDEDIR)/performer_mpi.h \
            $(LIBDIR)/libperformer_mpi.a $(LIBDIR)/libperformer_mpi.so.$(VERSION) \
            $(LIBDIR)/$(MPI_SONAME) $(LIBDIR)/libperformer_mpi.so $(PKGCONFIGDIR)/performer_mpi.pc
MPI_PC_PKG   = $(shell for p in ompi-c mpich; do pkg-config --exists $$p 2>/dev/null && \
                 echo $$p && break; done)
MPI_PC_CFLAGS = $(if $(MPI_PC_PKG),,$(shell $(MPICC) --showme:compile 2>/dev/null))
MPI_PC_LIBS   = $(if $(MPI_PC_PKG),,$(shell $(MPICC) --showme:link 2>/dev/null))

# Every install folder is used unquoted by the recipes below: a path with a space or a tab would
# split into two (make uninstall PREFIX="/a b" once removed the file /a), so such paths are
# refused, with a message, before anything is built, installed or removed.
pf_empty :=
pf_space := $(pf_empty) $(pf_empty)
pf_tab := $(pf_empty)	$(pf_empty)
INSTALL_PATHS = $(DESTDIR)|$(PREFIX)|$(BINDIR)|$(LIBDIR)|$(INCLUDEDIR)|$(INSTALL_PATHS_MORE)
INSTALL_PATHS_MORE = $(MANDIR)|$(PKGCONFIGDIR)|$(CMAKEDIR)
.PHONY: install-paths
INSTALL_PATHS_BAD = make: DESTDIR, PREFIX and the install folders must not contain spaces or \
  tabs (DESTDIR='$(DESTDIR)', PREFIX='$(PREFIX)'): nothing was installed or removed
install-paths:
	@$(if $(findstring $(pf_space),$(INSTALL_PATHS))$(findstring $(pf_tab),$(INSTALL_PATHS)),\
	  echo "$(INSTALL_PATHS_BAD)" >&2; exit 2,:)

install: install-paths
	@$(MAKE) --no-print-directory install-files

install-files: all
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call PC_DIR,$(LIBDIR))' \
	  'includedir=$(call PC_DIR,$(INCLUDEDIR))' '' 'Name: performer' \
	  'Description: fast attention over long sequences with random features (FAVOR+)' \
	  'Version: $(VERSION)' 'Libs: -L$${libdir} -lperformer' \
	  'Libs.private: $(PC_LIBS_PRIVATE)' 'Cflags: -I$${includedir}' >$(BUILD)/performer.pc
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) \
	  $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(MANDIR)/man1
	@mkdir -p $(INSTALL_TOOL_DIR)
	$(CC) -o $(INSTALL_TOOL_DIR)/performer $(TOOL_OBJ) $(TOOL_ALONE_OBJ) -L$(BUILD) -lperformer \
	  $(TOOL_RUNPATH) $(LDLIBS)
	install -m 755 $(INSTALL_TOOL_DIR)/performer $(DESTDIR)$(BINDIR)/performer
	install -m 644 include/performer.h $(DESTDIR)$(INCLUDEDIR)/performer.h
	install -m 644 $(STATIC) $(DESTDIR)$(LIBDIR)/libperformer.a
	install -m 644 $(SHARED_REAL) $(DESTDIR)$(LIBDIR)/libperformer.so.$(VERSION)
	ln -sf libperformer.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libperformer.so
	install -m 644 $(BUILD)/performer.pc $(DESTDIR)$(PKGCONFIGDIR)/performer.pc
	install -m 644 $(MAN) $(DESTDIR)$(MANDIR)/man1/performer.1
	sed $(CMAKE_SUBST) cmake/performerConfig.cmake.in >$(BUILD)/performerConfig.cmake
	sed $(CMAKE_SUBST) cmake/performerConfigVersion.cmake.in >$(BUILD)/performerConfigVersion.cmake
	install -d $(DESTDIR)$(CMAKEDIR)
	install -m 644 $(BUILD)/performerConfig.cmake $(BUILD)/performerConfigVersion.cmake \
	  $(DESTDIR)$(CMAKEDIR)
	$(if $(MPICC),printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call PC_DIR,$(LIBDIR))' \
	  'includedir=$(call PC_DIR,$(INCLUDEDIR))' '' 'Name: performer_mpi' \
	  'Description: sequence-parallel FAVOR+ over MPI (performer_mpi.h)' \
	  'Version: $(VERSION)' 'Requires: performer $(MPI_PC_PKG)' \
	  'Libs: $(strip -L$${libdir} -lperformer_mpi $(MPI_PC_LIBS))' \
	  'Cflags: $(strip -I$${includedir} $(MPI_PC_CFLAGS))' >$(BUILD)/performer_mpi.pc)
	$(if $(MPICC),$(MPICC) -o $(INSTALL_TOOL_DIR)/performer-mpi $(MPI_TOOL_OBJ) -L$(BUILD) \
	  -lperformer_mpi -lperformer $(TOOL_RUNPATH) $(LDLIBS))
	$(if $(MPICC),install -m 755 $(INSTALL_TOOL_DIR)/performer-mpi $(DESTDIR)$(BINDIR)/performer-mpi)
	$(if $(MPICC),install -m 644 include/performer_mpi.h $(DESTDIR)$(INCLUDEDIR)/performer_mpi.h)
	$(if $(MPICC),install -m 644 $(MPI_LIB) $(DESTDIR)$(LIBDIR)/libperformer_mpi.a)
	$(if $(MPICC),install -m 644 $(MPI_SO_REAL) \
	  $(DESTDIR)$(LIBDIR)/libperformer_mpi.so.$(VERSION))
	$(if $(MPICC),ln -sf libperformer_mpi.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(MPI_SONAME))
	$(if $(MPICC),ln -sf $(MPI_SONAME) $(DESTDIR)$(LIBDIR)/libperformer_mpi.so)
	$(if $(MPICC),install -m 644 $(BUILD)/performer_mpi.pc \
	  $(DESTDIR)$(PKGCONFIGDIR)/performer_mpi.pc)
	$(if $(filter 1,$(CUDA)),printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call PC_DIR,$(LIBDIR))' \
	  'includedir=$(call PC_DIR,$(INCLUDEDIR))' '' 'Name: performer_cuda' \
	  'Description: FAVOR+ on NVIDIA GPUs (performer_cuda.h)' \
	  'Version: $(VERSION)' 'Requires: performer' \
	  'Libs: -L$${libdir} -lperformer_cuda $(CUDA_PC_LIBS)' \
	  'Libs.private: $(CUDA_LDLIBS) -lstdc++' \
	  'Cflags: -I$${includedir} -I$(CUDA_HOME)/include' >$(BUILD)/performer_cuda.pc)
	$(if $(filter 1,$(CUDA)),install -m 644 include/performer_cuda.h \
	  $(DESTDIR)$(INCLUDEDIR)/performer_cuda.h)
	$(if $(filter 1,$(CUDA)),install -m 644 $(CUDA_LIB) $(DESTDIR)$(LIBDIR)/libperformer_cuda.a)
	$(if $(filter 1,$(CUDA)),install -m 644 $(CUDA_SO_REAL) \
	  $(DESTDIR)$(LIBDIR)/libperformer_cuda.so.$(VERSION))
	$(if $(filter 1,$(CUDA)),ln -sf libperformer_cuda.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(CUDA_SONAME))
	$(if $(filter 1,$(CUDA)),ln -sf $(CUDA_SONAME) $(DESTDIR)$(LIBDIR)/libperformer_cuda.so)
	$(if $(filter 1,$(CUDA)),install -m 644 $(BUILD)/performer_cuda.pc \
	  $(DESTDIR)$(PKGCONFIGDIR)/performer_cuda.pc)
	@echo "installed under $(DESTDIR)$(PREFIX): $(INSTALL_WHAT)"
	@$(LD_AFTER)

uninstall: install-paths
	rm -f $(addprefix $(DESTDIR),$(INSTALLED) $(INSTALLED_MPI) $(INSTALLED_CUDA))
	[ ! -d $(DESTDIR)$(CMAKEDIR) ] || rmdir --ignore-fail-on-non-empty $(DESTDIR)$(CMAKEDIR)
	@$(LD_AFTER)

# ---- MPI: sequence-parallel FAVOR+ (include/performer_mpi.h, src/mpi/) ---------------------------
# Its own library, libperformer_mpi (.a and .so), built only where mpicc is found; the core
# library, the tool and their tests never include MPI. Its test programs (tests/mpi/) are run
# under mpirun by tests/test_mpi.sh, which says so and skips where MPI is absent; its benchmark
# is bench/mpi/ (make bench-mpi).
MPICC      ?= $(shell command -v mpicc 2>/dev/null)
MPI_LIB     = $(BUILD)/libperformer_mpi.a
MPI_SONAME  = libperformer_mpi.so.$(SOVERSION)
MPI_SO_REAL = $(BUILD)/libperformer_mpi.so.$(VERSION)
MPI_SO      = $(BUILD)/libperformer_mpi.so
MPI_OBJ     = $(patsubst src/mpi/%.c,$(BUILD)/src/mpi/%.o,$(wildcard src/mpi/*.c))
MPI_TESTS   = $(patsubst tests/mpi/%.c,$(BUILD)/tests/mpi/%,$(wildcard tests/mpi/*.c))
MPI_BENCHES = $(patsubst bench/mpi/%.c,$(BUILD)/bench/mpi/%,$(wildcard bench/mpi/*.c))
# performer-mpi: the tool's objects, with tools/mpi/ but alone.c (built by mpicc: what only this
# build has) in place of alone.c, linked with libperformer_mpi. `mpirun -np N performer` runs it:
# the plain performer, started with more than one rank, starts it in its place. So the performer
# tool itself never links MPI.
MPI_TOOL     = $(BUILD)/performer-mpi
MPI_TOOL_SRC = $(filter-out tools/mpi/alone.c,$(wildcard tools/mpi/*.c))
MPI_TOOL_OBJ = $(TOOL_OBJ) $(MPI_TOOL_SRC:%.c=$(BUILD)/%.o)
.PHONY: mpi bench-mpi
ifneq ($(MPICC),)
all: $(MPI_LIB) $(MPI_SO) $(MPI_TOOL)
test-fast: $(MPI_TESTS)
mpi: $(MPI_LIB) $(MPI_SO) $(MPI_TESTS) $(MPI_BENCHES) $(MPI_TOOL)

$(BUILD)/src/mpi/%.o: src/mpi/%.c include/performer_mpi.h include/performer.h
	@mkdir -p $(dir $@)
	$(MPICC) $(ALLCFLAGS) -DPF_BUILDING_LIBRARY -fvisibility=hidden -c $< -o $@

$(MPI_LIB): $(MPI_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Named and linked as libperformer is (soname libperformer_mpi.so.MAJOR), against
# libperformer.so.MAJOR, found beside it ($ORIGIN) wherever both are.
$(MPI_SO_REAL): $(MPI_OBJ) $(SHARED)
	$(MPICC) -shared -Wl,-soname,$(MPI_SONAME) -o $@ $(MPI_OBJ) -L$(BUILD) -lperformer \
	  -Wl,-rpath,'$$ORIGIN' $(LDLIBS)

$(BUILD)/$(MPI_SONAME): $(MPI_SO_REAL)
	ln -sf $(notdir $<) $@

$(MPI_SO): $(BUILD)/$(MPI_SONAME)
	ln -sf $(MPI_SONAME) $@

$(MPI_TOOL_SRC:%.c=$(BUILD)/%.o): $(BUILD)/%.o: %.c include/performer.h include/performer_mpi.h \
                                   $(wildcard tools/*.h tools/mpi/*.h)
	@mkdir -p $(dir $@)
	$(MPICC) $(TOOL_CFLAGS) -c $< -o $@

$(MPI_TOOL): $(MPI_TOOL_OBJ) $(MPI_LIB) $(STATIC)
	$(MPICC) -o $@ $(MPI_TOOL_OBJ) $(MPI_LIB) $(STATIC) $(LDLIBS)

$(BUILD)/tests/mpi/%: tests/mpi/%.c tests/check.h $(MPI_LIB) $(STATIC)
	@mkdir -p $(dir $@)
	$(MPICC) $(ALLCFLAGS) -Itests -o $@ $< $(MPI_LIB) $(STATIC) $(LDLIBS)

$(BUILD)/bench/mpi/%: bench/mpi/%.c $(wildcard bench/*.h) $(MPI_LIB) $(STATIC)
	@mkdir -p $(dir $@)
	$(MPICC) $(ALLCFLAGS) -Ibench -o $@ $< $(MPI_LIB) $(STATIC) $(LDLIBS)

# Bytes per attention call against L, and per training step of the language model against its
# context, and their times at 1 and 2 ranks (CSVs and figures in $(BUILD)/bench/; docs/mpi.md
# holds a committed run and the scaling models built on it).
bench-mpi: setup mpi
	sh bench/mpi/run.sh $(BUILD)
else
mpi bench-mpi:
	@echo "mpicc not found: the MPI library is not built (make setup installs Open MPI)"
endif

# ---- CUDA: FAVOR+ on NVIDIA GPUs (include/performer_cuda.h, src/cuda/) --------------------------
# Its own library, libperformer_cuda (.a, .so with a soname, performer_cuda.pc), built only where
# nvcc is found (as the MPI library only where mpicc is); nothing else includes CUDA. A fat binary:
# machine code for sm_80 (A100) and sm_90 (H100, H200) and PTX for later chips. Its test program
# (tests/cuda/) runs under tests/test_cuda.sh, which skips, saying why, without a GPU; its
# benchmark is bench/cuda/bench_cuda.py (make bench-cuda). CUDA=0 leaves it out (the sanitizer
# build does: ASan does not instrument device code, and nvcc's build takes minutes).
NVCC      ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA      ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -g -lineinfo
CUDA_ALLFLAGS = -std=c++17 $(NVCCFLAGS) $(CUDA_ARCH) -DPF_BUILDING_LIBRARY -Iinclude \
             -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra -Xcudafe --display_error_number
CUDA_LDLIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart
CUDA_PC_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart
CUDA_LIB     = $(BUILD)/libperformer_cuda.a
CUDA_SONAME  = libperformer_cuda.so.$(SOVERSION)
CUDA_SO_REAL = $(BUILD)/libperformer_cuda.so.$(VERSION)
CUDA_SO      = $(BUILD)/libperformer_cuda.so
CUDA_OBJ     = $(patsubst src/cuda/%.cu,$(BUILD)/src/cuda/%.o,$(wildcard src/cuda/*.cu))
CUDA_TESTS   = $(patsubst tests/cuda/%.c,$(BUILD)/tests/cuda/%,$(wildcard tests/cuda/*.c))
INSTALLED_CUDA = $(INCLUDEDIR)/performer_cuda.h $(LIBDIR)/libperformer_cuda.a \
            $(LIBDIR)/libperformer_cuda.so.$(VERSION) $(LIBDIR)/$(CUDA_SONAME) \
            $(LIBDIR)/libperformer_cuda.so $(PKGCONFIGDIR)/performer_cuda.pc
.PHONY: cuda bench-cuda
ifeq ($(CUDA),1)
all: $(CUDA_LIB) $(CUDA_SO)
test-fast: $(CUDA_TESTS)
cuda: $(CUDA_LIB) $(CUDA_SO) $(CUDA_TESTS)

$(BUILD)/src/cuda/%.o: src/cuda/%.cu src/cuda/internal.cuh src/cuda/favor_parts.cuh include/performer_cuda.h \
                       include/performer.h
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_ALLFLAGS) -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Named and linked as libperformer is (soname libperformer_cuda.so.MAJOR), against
# libperformer.so.MAJOR found beside it ($$ORIGIN), cuBLAS and the CUDA runtime.
$(CUDA_SO_REAL): $(CUDA_OBJ) $(SHARED)
	$(CC) -shared -Wl,-soname,$(CUDA_SONAME) -o $@ $(CUDA_OBJ) -L$(BUILD) -lperformer \
	  -Wl,-rpath,'$$ORIGIN' $(CUDA_LDLIBS) -lstdc++ $(LDLIBS)

$(BUILD)/$(CUDA_SONAME): $(CUDA_SO_REAL)
	ln -sf $(notdir $<) $@

$(CUDA_SO): $(BUILD)/$(CUDA_SONAME)
	ln -sf $(CUDA_SONAME) $@

$(BUILD)/tests/cuda/%: tests/cuda/%.c $(wildcard tests/cuda/*.h) tests/check.h tests/ref.h $(CUDA_LIB) \
                     $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -I$(CUDA_HOME)/include -Itests -o $@ $< $(CUDA_LIB) $(STATIC) \
	  $(CUDA_LDLIBS) -lstdc++ $(LDLIBS)

# The GPU benchmark (a GPU and PyTorch with CUDA): docs/bench_cuda.txt holds a committed run.
bench-cuda: all
	PYTHONPATH=python /usr/bin/env python3 bench/cuda/bench_cuda.py --out $(BUILD)/bench_cuda.txt \
	  --csv $(BUILD)/bench_cuda.csv
else
cuda bench-cuda:
	@echo "nvcc not found: the CUDA library is not built (install the CUDA toolkit, or NVCC=path)"
endif

# ---- Examples (examples/): short programs a user reads first -------------------------------------
# `make` builds each examples/NAME.c into $(BUILD)/examples/NAME as a user's program would be
# built: the public header alone (no -Isrc), OpenMP for its own loops, the static library and
# what it needs after it. tests/test_examples.sh runs them. A new file in examples/ needs no edit
# here.
EXAMPLE_SRC = $(sort $(wildcard examples/*.c))
EXAMPLES    = $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
all: $(EXAMPLES)

$(BUILD)/examples/%: examples/%.c include/performer.h $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_POSIX_C_SOURCE=200809L $(CFLAGS) $(WARN) -fopenmp -Iinclude $(EXTRA_CFLAGS) \
	  -o $@ $< $(STATIC) $(LDLIBS)

# ---- aarch64 under emulation: make test-aarch64 --------------------------------------------------
# The library, the tool and the test programs cross-built by Debian's gcc-aarch64-linux-gnu into
# $(AARCH64_BUILD)/, against Debian's arm64 OpenBLAS (OpenMP build) and zlib (multiarch), and run
# by qemu-user (tests/run_aarch64.sh), then the tool's end-to-end tests (tests/test_tool.sh, the
# aarch64 tool under qemu, its demo's timings left out). A subset that fits CI's time (about three
# minutes emulated): AARCH64_TESTS, with AARCH64_PER_PATH on each vector path (test_simd and
# test_blas test every path themselves). Left out for their time under emulation (measured on this
# project's 2-core machine): test_favor_backward (4 to 5 min), test_model (72 s), test_favor_fit
# (46 s), test_favor_state (31 s; the decoding pass's kernel is in test_blas and test_simd),
# test_favor_slice (28 s); AARCH64_TESTS="..." runs any (all pass). `make setup` installs
# what it needs where it can; without it the target says what is missing and skips (no failure).
AARCH64_CC       ?= aarch64-linux-gnu-gcc
AARCH64_BUILD     = build-aarch64
QEMU_AARCH64     ?= qemu-aarch64
AARCH64_TESTS    ?= test_xarch test_simd test_blas test_features test_favor_forward \
                    test_attn_exact test_ra test_lara test_half test_rng test_projection \
                    test_special test_alias test_npy test_safetensors test_data
AARCH64_PER_PATH ?= test_xarch
AARCH64_NEEDS     = $(AARCH64_CC):$(shell command -v $(AARCH64_CC)) \
  $(QEMU_AARCH64):$(shell command -v $(QEMU_AARCH64)) \
  libopenblas-openmp-dev\:arm64:$(wildcard /usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so) \
  zlib1g-dev\:arm64:$(wildcard /usr/lib/aarch64-linux-gnu/libz.so) \
  libc6\:arm64:$(wildcard /lib/ld-linux-aarch64.so.1)
AARCH64_MISSING   = $(patsubst %:,%,$(filter %:,$(AARCH64_NEEDS)))
.PHONY: test-aarch64
test-aarch64:
ifneq ($(strip $(AARCH64_MISSING)),)
	@echo "test-aarch64: skipped: missing $(AARCH64_MISSING) (make setup installs them on Debian)"
else
	@mkdir -p $(AARCH64_BUILD); $(MAKE) --no-print-directory CC=$(AARCH64_CC) \
	  BUILD=$(AARCH64_BUILD) CUDA=0 MPICC= \
	  $(AARCH64_BUILD)/libperformer.a $(AARCH64_BUILD)/performer \
	  $(AARCH64_TESTS:%=$(AARCH64_BUILD)/tests/%) >$(AARCH64_BUILD)/build.log 2>&1 || \
	  { tail -n 30 $(AARCH64_BUILD)/build.log; echo "test-aarch64: the cross build failed"; exit 1; }
	@QEMU_AARCH64=$(QEMU_AARCH64) PER_PATH="$(AARCH64_PER_PATH)" \
	  sh tests/run_aarch64.sh $(AARCH64_BUILD) $(AARCH64_TESTS)
endif

format:
	clang-format -i include/*.h src/*.c src/*.h src/*/*.c src/*/*.h tools/*.c tools/*.h tools/*/*.c \
	  tests/*.c tests/*.h bench/*.c 2>/dev/null || true

clean:
	rm -rf build build-asan build-fuzz build-aarch64
