/*
 * Process identity and liveness, across pid namespaces.
 *
 * Tenants of one GPU run in different pid namespaces (containers), so a pid kept in a shared
 * region means nothing to a process of another namespace: judging it by /proc/<pid> there takes
 * tokens and memory from live processes.  An entry of a shared region (a ledger slot, an
 * arbiter client) therefore carries two things (abi.h, SG_ENTRY_LIVE_LOCK):
 *
 *   - a liveness lock: its owner holds an OFD write lock on one byte of the region's file
 *     (SG_LIVE_LOCK_BASE + the entry's index) for as long as it lives.  The kernel drops it
 *     when the open file goes, at exit or exec (O_CLOEXEC), whatever namespace anyone is in;
 *     any process that can open the file tests it with F_OFD_GETLK.  A forked child closes its
 *     copy (atfork handlers), so the lock follows the process that took it.
 *   - the identity: pid namespace (inode of /proc/self/ns/pid), pid in it, start time (field 22
 *     of /proc/<pid>/stat, ticks since boot).  It recognises our own entries (an exec leaves
 *     the old image's) and judges entries written without a lock (older shims), but only from
 *     the same namespace and with a /proc that is that namespace's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

/* Parse /proc/<pid>/stat (pid 0: self): state (field 3) and starttime (field 22).  -1: no such
 * process, 0: read, 1: could not tell (permission). */
int sg_read_stat(int32_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return (errno == ENOENT || errno == ESRCH) ? -1 : 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return n == 0 ? -1 : 1;
    buf[n] = '\0';
    /* The command (field 2) may hold spaces and ')': the fields resume after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return 1;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 1;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

void sg_identity_read(struct sg_identity *id)
{
    memset(id, 0, sizeof *id);
    char state;
    sg_read_stat(0, &state, &id->start);
    id->pid = (int32_t)getpid();
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0)
        id->pidns = (uint64_t)st.st_ino;
    /* /proc/self names us by our pid in the namespace of the mounted /proc: when that is not
     * getpid(), the /proc we see is another namespace's and no pid can be judged through it. */
    char link[32];
    ssize_t n = readlink("/proc/self", link, sizeof link - 1);
    if (n > 0) {
        link[n] = '\0';
        id->proc_is_ours = strtol(link, NULL, 10) == (long)id->pid;
    }
}

bool sg_identity_is(const struct sg_identity *self, uint64_t pidns, int32_t pid, uint64_t start)
{
    return pid == self->pid && start == self->start && (pidns == 0 || pidns == self->pidns);
}

int sg_live_open(const char *path)
{
    return open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
}

static void lock_range(struct flock *fl, short type, uint32_t index)
{
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = (off_t)(SG_LIVE_LOCK_BASE + index);
    fl->l_len = 1;
}

bool sg_live_hold(int fd, uint32_t index)
{
    struct flock fl;
    lock_range(&fl, F_WRLCK, index);
    return fd >= 0 && fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

void sg_live_drop(int fd, uint32_t index)
{
    struct flock fl;
    lock_range(&fl, F_UNLCK, index);
    if (fd >= 0)
        fcntl(fd, F_OFD_SETLK, &fl);
}

bool sg_entry_alive(int fd, uint32_t index, uint32_t flags, uint64_t pidns, int32_t pid,
                    uint64_t start, const struct sg_identity *self)
{
    if (pid <= 0)
        return false;
    if (flags & SG_ENTRY_LIVE_LOCK) {
        struct flock fl;
        lock_range(&fl, F_WRLCK, index);
        if (fd >= 0 && fcntl(fd, F_OFD_GETLK, &fl) == 0)
            return fl.l_type != F_UNLCK;
        /* cannot test the lock: judge by pid where we may */
    }
    if ((pidns && pidns != self->pidns) || !self->proc_is_ours)
        return true; /* another namespace's pid: never judged by pid */
    char state = 0;
    uint64_t t = 0;
    int rc = sg_read_stat(pid, &state, &t);
    if (rc < 0)
        return false;
    if (rc > 0)
        return true; /* cannot tell: keep it */
    if (state == 'Z' || state == 'X')
        return false; /* exited: the driver has released its memory */
    return t == start;
}
