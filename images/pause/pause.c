/* The sandbox ("pause") process of a pod on sharegpu's test node (issue 37): it only holds the
 * pod's namespaces. Written here so that the node needs no registry: built static, made an OCI
 * image by scripts/oci-image.py, imported into containerd and named as the CRI sandbox_image.
 *
 * It waits in pause(); SIGTERM or SIGINT ends it with status 0 (as PID 1 of the pod's PID
 * namespace it gets no default action for them, so handlers are needed); as PID 1 it also reaps
 * whatever child is reparented to it. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(void) {
    struct sigaction sa = {0};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;)
        pause();
}
