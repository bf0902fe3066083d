/* Memory workload for evictd's end-to-end tests and benchmarks. Built with gcc -static by
 * the test harness.
 *
 *   hog <control-file> [ignore-term]
 *     Keeps its allocation (touched, so really charged) at the number of MiB written in
 *     <control-file>, re-read every 10 ms after a change, backing off to 250 ms while it
 *     stays the same; it only grows. With "ignore-term" it ignores
 *     SIGTERM, so only SIGKILL ends it.
 *
 *   hog rate <MiB/s> <go-file> <log-file> [<hold-MiB> [ignore-term]]
 *     Allocates and touches <hold-MiB> at once (a victim that holds several GiB), waits for
 *     <go-file> to exist, then allocates and touches 1 MiB at a time at the given rate until
 *     it is killed, appending "<CLOCK_MONOTONIC ns> <MiB allocated>" to <log-file> after
 *     every MiB (the held MiB included): the benchmark's independent record of when the node
 *     crossed its threshold and of the last allocation before the kill. It ends on SIGTERM
 *     at once, unless "ignore-term" says to wait for SIGKILL.
 *
 *   hog fill <control-file> <path>
 *     Disk instead of memory: keeps the file <path> (in the container's writable layer, or
 *     in a volume) grown to the number of MiB in <control-file>, written and fsync'd 1 MiB
 *     at a time; it only grows. Ends on SIGTERM.
 *
 *   hog fork <control-file>
 *     Processes instead of memory: keeps as many sleeping child processes as the number in
 *     <control-file> says; it only grows. Ends on SIGTERM (its PID namespace ends the rest). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

/* The number in a control file; 0 while it is missing or being written. */
static long read_number(const char *path) {
    FILE *f = fopen(path, "r");
    long n = 0;
    if (f) { if (fscanf(f, "%ld", &n) != 1) n = 0; fclose(f); }
    return n;
}

/* Waits before the control file is read again: 10 ms while what it asks for is not reached
 * (`pending`: a full disk, a refused fork or allocation is tried again soon) or just after
 * a change, then twice as long each time up to 250 ms while nothing changes. A benchmark
 * node runs hundreds of these: a 10 ms poll each kept its two CPUs busy with the
 * workload's own control files. (inotify would wake at once, but its instances are
 * counted per user, 128 by default, shared with the machine's other root daemons.) */
static void wait_for_control(long want, int pending) {
    static long last_want = -1, interval_us = 10000;
    if (pending || want != last_want) interval_us = 10000;
    else if (interval_us < 250000) interval_us *= 2;
    if (interval_us > 250000) interval_us = 250000;
    last_want = want;
    usleep((useconds_t)interval_us);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int rate_mode(long mib_per_s, const char *go, const char *log, long hold, int ignore_term) {
    signal(SIGTERM, ignore_term ? SIG_IGN : stop);
    if (hold > 0) {
        char *h = malloc((size_t)hold << 20);
        if (!h) return 1;
        memset(h, 1, (size_t)hold << 20);
    }
    while (access(go, F_OK) != 0) usleep(1000);
    FILE *f = fopen(log, "w");
    if (!f) return 1;
    setvbuf(f, NULL, _IONBF, 0);
    long long start = now_ns();
    fprintf(f, "%lld %ld\n", start, hold);
    for (long mib = hold + 1;; mib++) {
        char *p = malloc(1 << 20);
        if (!p) return 1;
        memset(p, 1, 1 << 20);
        fprintf(f, "%lld %ld\n", now_ns(), mib);
        /* Pace: MiB number `mib` is due at start + mib/rate seconds. */
        long long due = start + (mib - hold) * 1000000000LL / mib_per_s;
        long long wait = due - now_ns();
        if (wait > 0) {
            struct timespec ts = { wait / 1000000000LL, wait % 1000000000LL };
            nanosleep(&ts, NULL);
        }
    }
}

static int fill_mode(const char *control, const char *path) {
    static char chunk[1 << 20];
    signal(SIGTERM, stop);
    memset(chunk, 7, sizeof chunk);
    FILE *out = fopen(path, "w");
    if (!out) { perror(path); return 1; }
    long have = 0;
    for (;;) {
        long want = read_number(control);
        for (; have < want; have++) {
            /* A full filesystem is the point of some tests: keep trying, never exit. */
            if (fwrite(chunk, 1, sizeof chunk, out) != sizeof chunk || fflush(out) != 0) { clearerr(out); break; }
            fsync(fileno(out));
        }
        wait_for_control(want, have < want);
    }
}

static int fork_mode(const char *control) {
    signal(SIGTERM, stop);
    long have = 0;
    for (;;) {
        long want = read_number(control);
        for (; have < want; have++) {
            pid_t pid = fork();
            if (pid == 0) { signal(SIGTERM, SIG_DFL); for (;;) pause(); }
            if (pid < 0) break;
        }
        wait_for_control(want, have < want);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "fill") == 0) return fill_mode(argv[2], argv[3]);
    if (argc >= 3 && strcmp(argv[1], "fork") == 0) return fork_mode(argv[2]);
    if (argc >= 5 && strcmp(argv[1], "rate") == 0)
        return rate_mode(atol(argv[2]), argv[3], argv[4], argc >= 6 ? atol(argv[5]) : 0,
                         argc >= 7 && strcmp(argv[6], "ignore-term") == 0);
    if (argc < 2) { fprintf(stderr, "usage: hog <control-file> [ignore-term] | hog rate <MiB/s> <go> <log> [hold-MiB [ignore-term]] | hog fill <control-file> <path>\n"); return 2; }
    signal(SIGTERM, argc > 2 && strcmp(argv[2], "ignore-term") == 0 ? SIG_IGN : stop);
    long have = 0;
    for (;;) {
        long want = read_number(argv[1]);
        if (want > have) {
            size_t n = (size_t)(want - have) << 20;
            char *p = malloc(n);
            if (p) { memset(p, 1, n); have = want; }
        }
        wait_for_control(want, want > have);
    }
}
