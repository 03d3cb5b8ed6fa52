/*
 * The shim's fatbin reader alone (fatnames.c, modnames.c, sharegpu/fatbin.h), compiled by
 * tests/integration/test_driver_memory.py with AddressSanitizer: each file named on the command
 * line is read into a buffer of exactly its size (so a read past the container's end is caught)
 * and scanned for names.  Prints "<index>=<CUresult>,<names>" per file.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../modnames.h"

void sg_log_once(int *once, const char *fmt, ...)
{
    (void)once;
    (void)fmt; /* the harness judges results, not lines */
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(size > 0 ? (size_t)size : 1);
    *n = buf && size > 0 ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        size_t n;
        unsigned char *image = slurp(argv[i], &n);
        if (!image)
            return 2;
        struct sg_names names = {0};
        CUresult res = n >= 16 ? sg_names_fatbin(&names, image, n) : CUDA_ERROR_INVALID_IMAGE;
        printf("%d=%d,%zu\n", i, (int)res, names.n);
        sg_names_free(&names);
        free(image);
    }
    return 0;
}
