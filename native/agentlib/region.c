/* Mapping a region file for the agent: validated exactly as the shim validates it. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

int sga_error(char err[SGA_ERR_LEN], const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, SGA_ERR_LEN, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int sga_map(const char *path, uint32_t magic, size_t size, void **out, char err[SGA_ERR_LEN])
{
    *out = NULL;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return sga_error(err, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < size) {
        close(fd);
        return sga_error(err, "%s: not a region of %zu bytes", path, size);
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return sga_error(err, "%s: cannot map: %s", path, strerror(errno));
    const struct sg_region_header *h = m;
    if (h->magic != magic || h->abi_major != SG_ABI_MAJOR || h->total_size < size) {
        int rc = sga_error(err, "%s: not a sharegpu %d.x region of this kind (magic 0x%08x, "
                                "ABI %u.%u, %u bytes)",
                           path, SG_ABI_MAJOR, h->magic, h->abi_major, h->abi_minor,
                           h->total_size);
        munmap(m, size);
        return rc;
    }
    *out = m;
    return 0;
}

void sga_unmap(void *map, size_t size)
{
    if (map)
        munmap(map, size);
}
