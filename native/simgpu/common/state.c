/*
 * The shared state file: created once (temp file, initialised, then renamed into place so no
 * process ever maps a half-written state), then mapped MAP_SHARED by every process.
 */
#include "sim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(struct sim_state) < UINT32_MAX, "size fits the size field");
_Static_assert(offsetof(struct sim_state, lock) % 8 == 0, "lock alignment");

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_state *mapped; /* atomic acquire/release: published once */

struct sim_state *sim_state_get(void)
{
    return __atomic_load_n(&mapped, __ATOMIC_ACQUIRE);
}

static int state_path(struct sim_err *e, char *out, size_t cap)
{
    const char *p = getenv("SIMGPU_STATE");
    int n;
    if (p && *p)
        n = snprintf(out, cap, "%s", p);
    else
        n = snprintf(out, cap, "/dev/shm/sharegpu-simgpu-%u", (unsigned)getuid());
    if (n < 0 || (size_t)n >= cap)
        return sim_fail(e, SIM_EINVAL, "SIMGPU_STATE path too long");
    return 0;
}

static int init_lock(struct sim_err *e, pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a))
        return sim_fail(e, SIM_EOS, "pthread_mutexattr_init failed");
    int rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!rc)
        rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!rc)
        rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return rc ? sim_fail(e, SIM_EOS, "cannot initialise the state mutex: %s", strerror(rc)) : 0;
}

/* Creates path atomically; returns 0 also when another process won the race (caller reopens). */
static int create_state(struct sim_err *e, const char *path, const struct sim_config *cfg)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%llu", path, (int)getpid(),
             (unsigned long long)(sim_now_ns() & 0xffffffu));
    const int explicit_path = getenv("SIMGPU_STATE") && *getenv("SIMGPU_STATE");
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return sim_fail(e, SIM_EOS, "cannot create %s: %s", tmp, strerror(errno));
    /* An explicitly named state may be shared by several users (tests, demos). */
    if (explicit_path)
        (void)fchmod(fd, 0666);
    size_t size = sizeof(struct sim_state);
    struct sim_state *st = MAP_FAILED;
    int rc = -1;
    if (ftruncate(fd, (off_t)size) < 0) {
        sim_fail(e, SIM_EOS, "cannot size %s: %s", tmp, strerror(errno));
        goto out;
    }
    st = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED) {
        sim_fail(e, SIM_EOS, "cannot map %s: %s", tmp, strerror(errno));
        goto out;
    }
    /* ftruncate gave zeroes: only non-zero fields need writing. */
    st->cfg = *cfg;
    st->created_ns = sim_now_ns();
    if (init_lock(e, &st->lock) < 0)
        goto out;
    st->version = SIM_STATE_VERSION;
    st->size = (uint32_t)size;
    __atomic_store_n(&st->magic, SIM_STATE_MAGIC, __ATOMIC_RELEASE);
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) < 0) {
        if (errno == EEXIST) {
            rc = 0; /* lost the race: the winner's file is as good as ours */
        } else if (errno == EINVAL || errno == ENOSYS) {
            /* File system without RENAME_NOREPLACE: link() also refuses to replace. */
            rc = (link(tmp, path) == 0 || errno == EEXIST)
                     ? 0
                     : sim_fail(e, SIM_EOS, "cannot publish %s: %s", path, strerror(errno));
        } else {
            sim_fail(e, SIM_EOS, "cannot publish %s: %s", path, strerror(errno));
        }
        goto out;
    }
    rc = 0;
out:
    if (st != MAP_FAILED)
        munmap(st, size);
    close(fd);
    unlink(tmp); /* no-op after a successful rename */
    return rc;
}

static int map_existing(struct sim_err *e, const char *path, int fd, struct sim_state **out)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return sim_fail(e, SIM_EOS, "cannot stat %s: %s", path, strerror(errno));
    if ((size_t)sb.st_size != sizeof(struct sim_state))
        return sim_fail(e, SIM_ESTATE,
                        "%s is not a simgpu state of this version (size %lld, expected %zu); "
                        "delete it or run `sharegpu simgpu reset`",
                        path, (long long)sb.st_size, sizeof(struct sim_state));
    struct sim_state *st =
        mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED)
        return sim_fail(e, SIM_EOS, "cannot map %s: %s", path, strerror(errno));
    /* The file is sparse and touched a few pages at a time: a fault must not read ahead (and
     * zero-fill) megabytes of holes around it on a disk file system. */
    (void)madvise(st, sizeof(*st), MADV_RANDOM);
    if (__atomic_load_n(&st->magic, __ATOMIC_ACQUIRE) != SIM_STATE_MAGIC ||
        st->version != SIM_STATE_VERSION || st->size != sizeof(struct sim_state) ||
        st->cfg.gpus < 1 || st->cfg.gpus > SIM_MAX_GPUS ||
        st->cfg.timeslice_us < SIM_TIMESLICE_US_MIN ||
        st->cfg.timeslice_us > SIM_TIMESLICE_US_MAX || st->cfg.ctxsw_us > SIM_SWITCH_US_MAX ||
        st->cfg.preempt_us > SIM_SWITCH_US_MAX || st->cfg.mps_block_us > SIM_MPS_BLOCK_US_MAX) {
        munmap(st, sizeof(*st));
        return sim_fail(e, SIM_ESTATE,
                        "%s is corrupt or from another simgpu version (bad magic/version/size); "
                        "delete it or run `sharegpu simgpu reset`",
                        path);
    }
    *out = st;
    return 0;
}

int sim_state_open(struct sim_err *e, struct sim_state **out)
{
    struct sim_state *st = sim_state_get();
    if (st) {
        *out = st;
        return 0;
    }
    pthread_mutex_lock(&open_mu);
    st = mapped;
    if (st) {
        pthread_mutex_unlock(&open_mu);
        *out = st;
        return 0;
    }
    int rc = -1;
    struct sim_config cfg;
    char path[4096];
    /* The config is validated even when the state exists, so a bad file is never ignored. */
    if (sim_config_load(e, &cfg) < 0 || state_path(e, path, sizeof(path)) < 0)
        goto out;
    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            if (create_state(e, path, &cfg) < 0)
                goto out;
            continue;
        }
        if (fd < 0) {
            sim_fail(e, SIM_EOS, "cannot open %s: %s", path, strerror(errno));
            goto out;
        }
        rc = map_existing(e, path, fd, &st);
        close(fd); /* the mapping keeps the file */
        if (rc < 0)
            goto out;
        if (((getenv("SIMGPU_CONFIG") && *getenv("SIMGPU_CONFIG")) ||
             (getenv("SIMGPU_TIMESLICE_US") && *getenv("SIMGPU_TIMESLICE_US"))) &&
            memcmp(&st->cfg, &cfg, sizeof(cfg)) != 0)
            sim_log("SIMGPU_CONFIG/SIMGPU_TIMESLICE_US differ from the existing state %s, which "
                    "keeps its own configuration (delete it or run `sharegpu simgpu reset` to "
                    "apply)",
                    path);
        __atomic_store_n(&mapped, st, __ATOMIC_RELEASE);
        *out = st;
        goto out;
    }
    rc = sim_fail(e, SIM_EOS, "cannot open or create %s", path);
out:
    pthread_mutex_unlock(&open_mu);
    return rc;
}

int sim_lock(struct sim_err *e, struct sim_state *st)
{
    int rc = pthread_mutex_lock(&st->lock);
    if (rc == 0)
        return 0;
    if (rc == EOWNERDEAD) {
        /* The holder died mid-update: recompute what it may have left half-written. */
        sim_repair_locked(st);
        st->repairs++;
        pthread_mutex_consistent(&st->lock);
        return 0;
    }
    return sim_fail(e, SIM_ESTATE, "state lock unusable: %s", strerror(rc));
}

void sim_unlock(struct sim_state *st)
{
    pthread_mutex_unlock(&st->lock);
}
