/* libsgagent internals: mapping and validating a region file. */
#ifndef SHAREGPU_SGAGENT_INTERNAL_H
#define SHAREGPU_SGAGENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "sgagent.h"

#pragma GCC visibility push(hidden)

/* Open path read-write and map `size` bytes MAP_SHARED after checking the header: magic, ABI
 * major, total_size and file size >= size.  0 and *out set, or -1 with err filled. */
int sga_map(const char *path, uint32_t magic, size_t size, void **out, char err[SGA_ERR_LEN]);
void sga_unmap(void *map, size_t size);
/* Fill err (printf-style) and return -1. */
int sga_error(char err[SGA_ERR_LEN], const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#pragma GCC visibility pop

#endif
