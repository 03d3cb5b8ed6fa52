/* The shim's liveness rule (shim/live.c) for the agent's and the CLI's readers: whether the
 * process an entry of a region names still lives, and a process's start time.  Python calls
 * these rather than keep a copy of the rule (src/sharegpu/regions/liveness.py). */
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include "../shim/shim.h"
#include "internal.h"

static pthread_mutex_t identity_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sg_identity identity;

/* This process's identity, read again after a fork (a child has its own). */
static struct sg_identity current_identity(void)
{
    pthread_mutex_lock(&identity_mu);
    if (identity.pid != (int32_t)getpid())
        sg_identity_read(&identity);
    struct sg_identity id = identity;
    pthread_mutex_unlock(&identity_mu);
    return id;
}

int sga_entry_alive(const char *path, uint32_t index, uint32_t flags, uint64_t pidns, int32_t pid,
                    uint64_t start)
{
    /* Read-only is enough to ask whether another holds the lock (F_OFD_GETLK); a reader may
     * not be allowed to write the region. */
    int fd = (flags & SG_ENTRY_LIVE_LOCK) ? open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    struct sg_identity self = current_identity();
    bool alive = sg_entry_alive(fd, index, flags, pidns, pid, start, &self);
    if (fd >= 0)
        close(fd);
    return alive ? 1 : 0;
}

int sga_start_time(int32_t pid, uint64_t *start)
{
    char state = 0;
    int rc = sg_read_stat(pid, &state, start);
    if (rc == 0 && (state == 'Z' || state == 'X'))
        return -1; /* exited: only its zombie is left */
    return rc;
}
