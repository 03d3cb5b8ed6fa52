/*
 * The JIT linker (cuLinkCreate ... cuLinkComplete).  Nothing is compiled: linking PTX inputs gives
 * their concatenated text, which cuModuleLoadData then reads like any PTX (entries, variables).
 * An input that is not PTX (cubin, fatbin, object, library) makes the result an opaque binary
 * image, which accepts every kernel name, as a loaded cubin does here.
 */
#include "cu.h"

#include <stdlib.h>
#include <string.h>

#define LINK_MAGIC 0x4c4e4b31u
#define JIT_INPUT_PTX 1
#define JIT_INPUT_NVVM 5
#define JIT_NUM_INPUT_TYPES 6

struct CUlinkState_st {
    uint32_t magic;
    int binary;  /* an input was not PTX */
    char *text;  /* the PTX inputs, one after the other, NUL-terminated */
    size_t len;
    void *image; /* cuLinkComplete's result, owned until cuLinkDestroy */
};

SIM_EXPORT CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues,
                                    CUlinkState *stateOut)
{
    if (!stateOut || (numOptions && (!options || !optionValues)))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r)
        return r;
    struct CUlinkState_st *s = calloc(1, sizeof(*s));
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = LINK_MAGIC;
    *stateOut = s;
    return CUDA_SUCCESS;
}

static CUresult add(struct CUlinkState_st *s, CUjitInputType type, const void *data, size_t size)
{
    if (!s || s->magic != LINK_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!data || type < 0 || type >= JIT_NUM_INPUT_TYPES || type == JIT_INPUT_NVVM)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != JIT_INPUT_PTX) {
        s->binary = 1;
        return CUDA_SUCCESS;
    }
    size_t n = strnlen(data, size ? size : (size_t)-1);
    if (!strstr(data, ".version") && !strstr(data, ".target"))
        return CUDA_ERROR_INVALID_PTX;
    char *t = realloc(s->text, s->len + n + 2);
    if (!t)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(t + s->len, data, n);
    s->len += n;
    t[s->len++] = '\n';
    t[s->len] = '\0';
    s->text = t;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                     const char *name, unsigned int numOptions, CUjit_option *options,
                                     void **optionValues)
{
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    return add(state, type, data, size);
}

SIM_EXPORT CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path,
                                     unsigned int numOptions, CUjit_option *options,
                                     void **optionValues)
{
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    if (!state || state->magic != LINK_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r;
    void *data = cu_read_file(path, NULL, &r);
    if (!data)
        return r;
    r = add(state, type, data, 0);
    free(data);
    return r;
}

SIM_EXPORT CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    if (!state || state->magic != LINK_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!cubinOut || !sizeOut)
        return CUDA_ERROR_INVALID_VALUE;
    if (!state->binary && !state->text)
        return CUDA_ERROR_INVALID_VALUE; /* nothing was added */
    free(state->image);
    if (state->binary) {
        static const unsigned char elf[16] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33};
        state->image = malloc(sizeof(elf));
        if (!state->image)
            return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(state->image, elf, sizeof(elf));
        *sizeOut = sizeof(elf);
    } else {
        state->image = strdup(state->text);
        if (!state->image)
            return CUDA_ERROR_OUT_OF_MEMORY;
        *sizeOut = state->len + 1;
    }
    *cubinOut = state->image;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuLinkDestroy(CUlinkState state)
{
    if (!state || state->magic != LINK_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    state->magic = 0;
    free(state->text);
    free(state->image);
    free(state);
    return CUDA_SUCCESS;
}
