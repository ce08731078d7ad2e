/* harness.h: what the libFuzzer targets in tests/fuzz/ share.
 *
 * The readers take a path, and will refuse anything that is not a regular file (a pipe, a FIFO,
 * /dev/stdin), so each input is written to a real file: one per process, created once under
 * $TMPDIR (or /tmp) and rewritten in place for every input. A property the target checks on
 * top of the sanitizers is FUZZ_CHECK, which prints what failed and aborts, so libFuzzer
 * records the input as a crash. */
#ifndef PF_FUZZ_HARNESS_H
#define PF_FUZZ_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* libFuzzer's entry point: each target defines it. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's hook for a mutator of the target's own (the framed targets define it), and its
 * default mutation, which a custom mutator may call (dictionary included). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* Formats whose header is framed by its length: safetensors (a u64 N, then N bytes of JSON)
 * and .npy (magic, version, a u16 or u32 length, then the header dict). A default mutation
 * that changes the header's length breaks the frame, and the reader stops at once; so a quarter
 * of the time (by seed) these mutate the header alone by libFuzzer's mutation, a quarter
 * replace one number in it (a dimension, an offset, a configuration value) by an edge value or
 * a random one, and write its new length; the other half (or if the input is not framed) is
 * libFuzzer's mutation of the whole input. Returns the new size (<= max_size). */
size_t fuzz_mutate_safetensors(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t fuzz_mutate_npy(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

/* Writes data[0..size) to this process's input file and returns its path (valid until exit,
 * when the file is removed). Aborts if the file cannot be created or written: a broken harness
 * must not pass for a quiet reader. */
const char *fuzz_input_file(const uint8_t *data, size_t size);

/* A second path in the same folder, for the targets that write a file back (removed at exit;
 * nothing is created here). */
const char *fuzz_output_path(void);

/* Prints the failed check and where it is, then aborts. */
_Noreturn void fuzz_fail(const char *check, const char *file, int line);

#define FUZZ_CHECK(cond) ((cond) ? (void)0 : fuzz_fail(#cond, __FILE__, __LINE__))

#endif
