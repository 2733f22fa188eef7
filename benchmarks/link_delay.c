/* A one-way link delay for a process's socket sends, for benchmarks.distributed on kernels without
 * tc netem (sch_netem): LD_PRELOAD this and set COREAI_LINK_DELAY_US; every send() (what MLX's ring
 * backend calls to put a message on the wire) leaves that many microseconds after it was called, as
 * if the packet had crossed a link with that latency. Unlike netem, the sending thread waits too,
 * and a message sent in several send() calls is delayed once per call. The wait sleeps until
 * SPIN_NS before the time, then spins: a sleep here wakes 40-50 us late (measured on this machine's
 * VM), most of a 50 us delay.
 *
 *     gcc -O2 -shared -fPIC -o link_delay.so link_delay.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>

#define SPIN_NS 80000L

static ssize_t (*real_send)(int, const void *, size_t, int);
static long delay_ns;

__attribute__((constructor)) static void init(void) {
    const char *us = getenv("COREAI_LINK_DELAY_US");
    delay_ns = us ? atol(us) * 1000L : 0;
    real_send = (ssize_t(*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
    prctl(PR_SET_TIMERSLACK, 1UL); /* the default 50 us of slack would be most of a 50 us delay */
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    if (delay_ns > 0) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long until = now.tv_sec * 1000000000LL + now.tv_nsec + delay_ns;
        if (delay_ns > SPIN_NS) {
            long long wake = until - SPIN_NS;
            struct timespec t = {wake / 1000000000LL, wake % 1000000000LL};
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {
            }
        }
        do {
            clock_gettime(CLOCK_MONOTONIC, &now);
        } while (now.tv_sec * 1000000000LL + now.tv_nsec < until);
    }
    return real_send(fd, buf, len, flags);
}
