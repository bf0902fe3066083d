/* Memory workload for evictd's end-to-end tests and benchmarks. Built with gcc -static by
 * the test harness.
 *
 *   hog <control-file> [ignore-term]
 *     Keeps its allocation (touched, so really charged) at the number of MiB written in
 *     <control-file>, re-read every 10 ms after a change, backing off to 250 ms while it
 *     stays the same; it only grows. With "ignore-term" it ignores
 *     SIGTERM, so only SIGKILL ends it.
 *
 *   hog rate <MiB/s> <go-file> <stamps-file> [<hold-MiB> [ignore-term]]
 *     Allocates and touches <hold-MiB> at once (a victim that holds several GiB), waits for
 *     <go-file> to exist, then allocates 1 MiB at a time at the given rate until it is
 *     killed, touching it page by page and stamping each page in <stamps-file>: the
 *     benchmark's independent record of when the node crossed its threshold and of the last
 *     allocation before the kill. The file is native u64s: the page size, <hold-MiB>, the
 *     CLOCK_MONOTONIC ns at which <go-file> was seen, then one ns stamp per page touched
 *     since, taken just after the touch (0: not reached), for up to STAMPED_BYTES of growth.
 *     It is mapped shared and written in place, its pages made present and dirty before
 *     the go: stamping takes no system call and waits for no filesystem, so a stamp is
 *     never late by the log's own I/O (a write(2) of a line per MiB was: on a busy ext4 it
 *     can wait tens of ms for the journal, and the crossing was placed early by as much).
 *     It ends on SIGTERM at once, unless "ignore-term" says to wait for SIGKILL.
 *
 *   hog fill <control-file> <path>
 *     Disk instead of memory: keeps the file <path> (in the container's writable layer, or
 *     in a volume) grown to the number of MiB in <control-file>, written and fsync'd 1 MiB
 *     at a time; it only grows. Ends on SIGTERM.
 *
 *   hog fork <control-file>
 *     Processes instead of memory: keeps as many sleeping child processes as the number in
 *     <control-file> says; it only grows. Ends on SIGTERM (its PID namespace ends the rest). */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* Growth stamped in rate mode: more than any benchmark's node lets a victim reach. */
#define STAMPED_BYTES (4LL << 30)
enum { STAMP_PAGE_SIZE, STAMP_HOLD_MIB, STAMP_START, STAMP_HEADER };

/* The stamps file, mapped shared with every page present and dirty; NULL on failure. */
static uint64_t *map_stamps(const char *path, long page, size_t *count) {
    *count = STAMP_HEADER + (size_t)(STAMPED_BYTES / page);
    size_t len = *count * sizeof(uint64_t);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) return NULL;
    uint64_t *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED) return NULL;
    /* Written once now, so that no stamp later faults a page in (MAP_POPULATE alone maps
     * them read-only on some filesystems: the first write would still reach ext4). */
    memset(s, 0, len);
    return s;
}

static int rate_mode(long mib_per_s, const char *go, const char *path, long hold, int ignore_term) {
    signal(SIGTERM, ignore_term ? SIG_IGN : stop);
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || mib_per_s <= 0) return 1;
    if (hold > 0) {
        char *h = malloc((size_t)hold << 20);
        if (!h) return 1;
        memset(h, 1, (size_t)hold << 20);
    }
    size_t count;
    uint64_t *stamps = map_stamps(path, page, &count);
    if (!stamps) { perror(path); return 1; }
    stamps[STAMP_PAGE_SIZE] = (uint64_t)page;
    stamps[STAMP_HOLD_MIB] = (uint64_t)hold;
    while (access(go, F_OK) != 0) usleep(1000);
    long long start = now_ns();
    stamps[STAMP_START] = (uint64_t)start;
    size_t next = STAMP_HEADER;
    for (long mib = 1;; mib++) {
        char *p = malloc(1 << 20);
        if (!p) return 1;
        for (long off = 0; off < (1 << 20); off += page) {
            memset(p + off, 1, (size_t)page);
            if (next < count) stamps[next++] = (uint64_t)now_ns();
        }
        /* Pace: the `mib`th MiB after the go is due at start + mib/rate seconds. */
        long long due = start + mib * 1000000000LL / mib_per_s;
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
    if (argc < 2) { fprintf(stderr, "usage: hog <control-file> [ignore-term] | hog rate <MiB/s> <go> <stamps> [hold-MiB [ignore-term]] | hog fill <control-file> <path>\n"); return 2; }
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
