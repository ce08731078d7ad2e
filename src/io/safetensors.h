/* safetensors.h: reading and writing the safetensors format (huggingface/safetensors), F32 only.
 *
 * A file is: an 8-byte little-endian header length N, N bytes of JSON (an object mapping each
 * tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" object of string values), then the tensors' raw little-endian bytes; offsets
 * are relative to the end of the header and the tensors tile the data exactly. Not installed. */
#ifndef PF_SAFETENSORS_H
#define PF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define PF_ST_MAX_DIMS 8

typedef struct pf_st_tensor {
    char *name;
    int ndim;
    int64_t shape[PF_ST_MAX_DIMS];
    size_t count;     /* elements: the product of shape */
    const void *data; /* count float32 values, little-endian, possibly unaligned */
} pf_st_tensor;

typedef struct pf_st_file {
    unsigned char *buf; /* the whole file */
    size_t size;
    pf_st_tensor *tensors;
    int n;
    char **meta; /* key, value, key, value, ..., NULL */
    int nmeta;   /* pairs */
} pf_st_file;

/* Reads and validates a whole file: header length within the file, JSON well formed, every
 * dtype F32, shapes matching offsets, tensors tiling the data with nothing left over, unique
 * names. PF_EIO if it cannot be read, PF_EFORMAT otherwise; errmsg names the file and the
 * fault. On failure f is empty. */
PF_INTERNAL pf_status pf_st_read(const char *path, pf_st_file *f, char *errmsg, size_t errlen);

/* Frees what pf_st_read allocated; harmless on an empty or zeroed f. */
PF_INTERNAL void pf_st_free(pf_st_file *f);

/* A tensor by name, or NULL. */
PF_INTERNAL const pf_st_tensor *pf_st_find(const pf_st_file *f, const char *name);

/* A metadata value by key, or NULL. */
PF_INTERNAL const char *pf_st_meta(const pf_st_file *f, const char *key);

/* A tensor to write: name, shape (ndim 0..PF_ST_MAX_DIMS) and float data (count values). */
typedef struct pf_st_entry {
    const char *name;
    int ndim;
    int64_t shape[PF_ST_MAX_DIMS];
    const float *data;
} pf_st_entry;

/* Writes n tensors and the metadata (key, value, ..., NULL; may be NULL) to path atomically: a
 * temporary file in the same folder, flushed to disk, then renamed over path. On failure
 * nothing is left behind. PF_EINVAL (bad names or shapes, duplicate names), PF_EIO, PF_ENOMEM. */
PF_INTERNAL pf_status pf_st_write(const char *path, const pf_st_entry *t, int n,
                                  const char *const *meta, char *errmsg, size_t errlen);

#endif
