/*
 * SIMGPU_CONFIG: a flat JSON object, parsed strictly.  Any unknown key, duplicate key, wrong type
 * or out-of-range value is an error naming the culprit, so a typo never silently yields defaults.
 */
#include "sim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GIB (1024ull * 1024ull * 1024ull)
#define CONFIG_MAX_BYTES 65536

void sim_config_defaults(struct sim_config *c)
{
    memset(c, 0, sizeof(*c));
    c->gpus = 2;
    c->sm_count = 132;
    c->memory_bytes = 80ull * GIB;
    c->cuda_version = 13000;
    c->cc_major = 9;
    c->cc_minor = 0;
    c->timeslice_us = SIM_TIMESLICE_US_DEFAULT;
    c->ctxsw_us = SIM_CTXSW_US_DEFAULT;
    c->preempt_us = SIM_PREEMPT_US_DEFAULT;
    /* Not the 512 bytes an interposer might assume: it must read the pitch the driver returns. */
    c->pitch_alignment = 1024;
    strcpy(c->name, "sharegpu simulated H100");
    strcpy(c->driver_version, "580.65.06");
}

struct parser {
    const char *p;
    struct sim_err *e;
};

static void skip_ws(struct parser *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

/* A JSON string of printable ASCII (escapes \" \\ \/ only) into out[cap]. */
static int parse_string(struct parser *ps, char *out, size_t cap, const char *what)
{
    if (*ps->p != '"')
        return sim_fail(ps->e, SIM_ECONFIG, "expected a string for %s", what);
    ps->p++;
    size_t n = 0;
    for (;;) {
        char ch = *ps->p;
        if (ch == '\0')
            return sim_fail(ps->e, SIM_ECONFIG, "unterminated string for %s", what);
        ps->p++;
        if (ch == '"')
            break;
        if (ch == '\\') {
            char esc = *ps->p++;
            if (esc != '"' && esc != '\\' && esc != '/')
                return sim_fail(ps->e, SIM_ECONFIG, "unsupported escape in %s", what);
            ch = esc;
        } else if ((unsigned char)ch < 0x20 || (unsigned char)ch > 0x7e) {
            return sim_fail(ps->e, SIM_ECONFIG, "non-printable character in %s", what);
        }
        if (n + 1 >= cap)
            return sim_fail(ps->e, SIM_ECONFIG, "%s is longer than %zu characters", what, cap - 1);
        out[n++] = ch;
    }
    out[n] = '\0';
    return 0;
}

/* A non-negative JSON integer within [lo, hi]. */
static int parse_uint(struct parser *ps, const char *key, unsigned long long lo,
                      unsigned long long hi, unsigned long long *out)
{
    if (*ps->p < '0' || *ps->p > '9')
        return sim_fail(ps->e, SIM_ECONFIG, "\"%s\" must be an integer", key);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(ps->p, &end, 10);
    if (errno || *end == '.' || *end == 'e' || *end == 'E' || (ps->p[0] == '0' && end - ps->p > 1))
        return sim_fail(ps->e, SIM_ECONFIG, "\"%s\" must be an integer", key);
    if (v < lo || v > hi)
        return sim_fail(ps->e, SIM_ECONFIG, "\"%s\" must be between %llu and %llu, got %llu", key,
                        lo, hi, v);
    ps->p = end;
    *out = v;
    return 0;
}

enum {
    K_GPUS, K_MEM, K_NAME, K_SM, K_DRV, K_CUDA, K_SLICE, K_CTXMEM, K_PITCH, K_CTXSW, K_PREEMPT,
    K_MPS, K_CCMAJOR, K_UUID0, K_COUNT
};
static const char *const keys[K_COUNT] = {"gpus",           "memory_mib",   "name",
                                          "sm_count",       "driver_version", "cuda_version",
                                          "timeslice_us",   "context_overhead_mib",
                                          "pitch_alignment", "ctxsw_us",    "preempt_us",
                                          "mps_block_us", "cc_major", "uuid0"};

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into 16 bytes. */
static int parse_uuid(struct parser *ps, unsigned char out[16])
{
    char text[64];
    if (parse_string(ps, text, sizeof(text), "\"uuid0\"") < 0)
        return -1;
    const char *p = text;
    if (strncmp(p, "GPU-", 4) != 0 || strlen(p) != 40)
        return sim_fail(ps->e, SIM_ECONFIG, "\"uuid0\" must be GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, not %s", text);
    p += 4;
    for (int i = 0; i < 16; i++) {
        if (*p == '-')
            p++;
        unsigned v;
        if (sscanf(p, "%2x", &v) != 1 || !p[0] || !p[1] || p[0] == '-' || p[1] == '-')
            return sim_fail(ps->e, SIM_ECONFIG, "\"uuid0\": not hexadecimal: %s", text);
        out[i] = (unsigned char)v;
        p += 2;
    }
    return 0;
}

static int parse_value(struct parser *ps, int k, struct sim_config *c)
{
    unsigned long long v;
    switch (k) {
    case K_GPUS:
        if (parse_uint(ps, keys[k], 1, SIM_MAX_GPUS, &v) < 0)
            return -1;
        c->gpus = (uint32_t)v;
        return 0;
    case K_MEM:
        /* Up to 16 TiB: far beyond any card, still far below the address space we reserve. */
        if (parse_uint(ps, keys[k], 1, 16ull * 1024 * 1024, &v) < 0)
            return -1;
        c->memory_bytes = v * 1024ull * 1024ull;
        return 0;
    case K_NAME:
        if (parse_string(ps, c->name, sizeof(c->name), "\"name\"") < 0)
            return -1;
        return c->name[0] ? 0 : sim_fail(ps->e, SIM_ECONFIG, "\"name\" must not be empty");
    case K_SM:
        if (parse_uint(ps, keys[k], 1, 1024, &v) < 0)
            return -1;
        c->sm_count = (uint32_t)v;
        return 0;
    case K_DRV:
        if (parse_string(ps, c->driver_version, sizeof(c->driver_version), "\"driver_version\"") < 0)
            return -1;
        return c->driver_version[0] ? 0
                                    : sim_fail(ps->e, SIM_ECONFIG, "\"driver_version\" must not be empty");
    case K_CUDA:
        if (parse_uint(ps, keys[k], 1000, 99999, &v) < 0)
            return -1;
        c->cuda_version = (int32_t)v;
        return 0;
    case K_SLICE:
        if (parse_uint(ps, keys[k], SIM_TIMESLICE_US_MIN, SIM_TIMESLICE_US_MAX, &v) < 0)
            return -1;
        c->timeslice_us = (uint32_t)v;
        return 0;
    case K_CTXSW:
    case K_PREEMPT:
        if (parse_uint(ps, keys[k], 0, SIM_SWITCH_US_MAX, &v) < 0)
            return -1;
        *(k == K_CTXSW ? &c->ctxsw_us : &c->preempt_us) = (uint32_t)v;
        return 0;
    case K_MPS:
        if (parse_uint(ps, keys[k], 0, SIM_MPS_BLOCK_US_MAX, &v) < 0)
            return -1;
        c->mps_block_us = (uint32_t)v;
        return 0;
    case K_CCMAJOR:
        /* The compute capability's major number (minor stays 0): 9 (Hopper) by default; below 9
         * the driver still has the device runtime's sync depth (limits.c). */
        if (parse_uint(ps, keys[k], 5, 12, &v) < 0)
            return -1;
        c->cc_major = (int32_t)v;
        return 0;
    case K_UUID0:
        if (parse_uuid(ps, c->uuid0) < 0)
            return -1;
        c->uuid0_set = 1;
        return 0;
    case K_CTXMEM:
        /* Checked against memory_mib once the whole object is read (sim_config_parse). */
        if (parse_uint(ps, keys[k], 0, 16ull * 1024 * 1024, &v) < 0)
            return -1;
        c->context_overhead_bytes = v * 1024ull * 1024ull;
        return 0;
    case K_PITCH:
        if (parse_uint(ps, keys[k], 32, 4096, &v) < 0)
            return -1;
        if (v & (v - 1))
            return sim_fail(ps->e, SIM_ECONFIG, "\"pitch_alignment\" must be a power of two, not %llu", v);
        c->pitch_alignment = (uint32_t)v;
        return 0;
    }
    return sim_fail(ps->e, SIM_ECONFIG, "internal: bad key index");
}

int sim_config_parse(struct sim_err *e, const char *text, struct sim_config *c)
{
    struct parser ps = {.p = text, .e = e};
    int seen[K_COUNT] = {0};
    skip_ws(&ps);
    if (*ps.p != '{')
        return sim_fail(e, SIM_ECONFIG, "expected a JSON object");
    ps.p++;
    skip_ws(&ps);
    if (*ps.p == '}') {
        ps.p++;
    } else {
        for (;;) {
            char key[64];
            skip_ws(&ps);
            if (parse_string(&ps, key, sizeof(key), "a key") < 0)
                return -1;
            int k = 0;
            while (k < K_COUNT && strcmp(keys[k], key) != 0)
                k++;
            if (k == K_COUNT)
                return sim_fail(e, SIM_ECONFIG,
                                "unknown key \"%s\" (known: gpus, memory_mib, name, sm_count, "
                                "driver_version, cuda_version, timeslice_us, "
                                "context_overhead_mib, pitch_alignment, ctxsw_us, preempt_us, "
                                "mps_block_us, cc_major, uuid0)",
                                key);
            if (seen[k]++)
                return sim_fail(e, SIM_ECONFIG, "duplicate key \"%s\"", key);
            skip_ws(&ps);
            if (*ps.p != ':')
                return sim_fail(e, SIM_ECONFIG, "expected ':' after \"%s\"", key);
            ps.p++;
            skip_ws(&ps);
            if (parse_value(&ps, k, c) < 0)
                return -1;
            skip_ws(&ps);
            if (*ps.p == ',') {
                ps.p++;
                continue;
            }
            if (*ps.p == '}') {
                ps.p++;
                break;
            }
            return sim_fail(e, SIM_ECONFIG, "expected ',' or '}' after \"%s\"", key);
        }
    }
    skip_ws(&ps);
    if (*ps.p != '\0')
        return sim_fail(e, SIM_ECONFIG, "trailing characters after the object");
    if (c->context_overhead_bytes >= c->memory_bytes)
        return sim_fail(e, SIM_ECONFIG, "\"context_overhead_mib\" must be less than memory_mib");
    return 0;
}

/* An environment variable in microseconds overrides the file's value (same range). */
static int us_env(struct sim_err *e, const char *name, uint32_t lo, uint32_t hi, uint32_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long us = strtoull(v, &end, 10);
    if (errno || *end || *v < '0' || *v > '9' || us < lo || us > hi)
        return sim_fail(e, SIM_ECONFIG, "%s=%.40s: expected microseconds (%u..%u)", name, v, lo,
                        hi);
    *out = (uint32_t)us;
    return 0;
}

static int config_file(struct sim_err *e, struct sim_config *c)
{
    const char *path = getenv("SIMGPU_CONFIG");
    if (!path || !*path)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sim_fail(e, SIM_ECONFIG, "SIMGPU_CONFIG=%s: %s", path, strerror(errno));
    char *buf = malloc(CONFIG_MAX_BYTES + 1);
    if (!buf) {
        close(fd);
        return sim_fail(e, SIM_ENOMEM, "out of host memory");
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, CONFIG_MAX_BYTES + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n > CONFIG_MAX_BYTES)
            break;
    }
    close(fd);
    if (n > CONFIG_MAX_BYTES) {
        free(buf);
        return sim_fail(e, SIM_ECONFIG, "SIMGPU_CONFIG=%s: larger than %d bytes", path,
                        CONFIG_MAX_BYTES);
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n)) {
        free(buf);
        return sim_fail(e, SIM_ECONFIG, "SIMGPU_CONFIG=%s: contains a NUL byte", path);
    }
    struct sim_err inner = {0};
    int rc = sim_config_parse(&inner, buf, c);
    free(buf);
    if (rc < 0)
        return sim_fail(e, SIM_ECONFIG, "SIMGPU_CONFIG=%s: %s", path, inner.msg);
    return 0;
}

int sim_config_load(struct sim_err *e, struct sim_config *c)
{
    sim_config_defaults(c);
    if (config_file(e, c) < 0 ||
        us_env(e, "SIMGPU_TIMESLICE_US", SIM_TIMESLICE_US_MIN, SIM_TIMESLICE_US_MAX,
               &c->timeslice_us) < 0 ||
        us_env(e, "SIMGPU_CTXSW_US", 0, SIM_SWITCH_US_MAX, &c->ctxsw_us) < 0 ||
        us_env(e, "SIMGPU_MPS_BLOCK_US", 0, SIM_MPS_BLOCK_US_MAX, &c->mps_block_us) < 0)
        return -1;
    return us_env(e, "SIMGPU_PREEMPT_US", 0, SIM_SWITCH_US_MAX, &c->preempt_us);
}
