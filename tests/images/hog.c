/* Memory workload for evictd's end-to-end tests.
 *   hog <control-file> [ignore-term]
 * Keeps its allocation (touched, so really charged) at the number of MiB written in
 * <control-file>, re-read every 10 ms; it only grows. With "ignore-term" it ignores SIGTERM,
 * so only SIGKILL ends it. Built with gcc -static by the test harness. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: hog <control-file> [ignore-term]\n"); return 2; }
    signal(SIGTERM, argc > 2 && strcmp(argv[2], "ignore-term") == 0 ? SIG_IGN : stop);
    long have = 0;
    for (;;) {
        FILE *f = fopen(argv[1], "r");
        long want = 0;
        if (f) { if (fscanf(f, "%ld", &want) != 1) want = 0; fclose(f); }
        if (want > have) {
            size_t n = (size_t)(want - have) << 20;
            char *p = malloc(n);
            if (p) { memset(p, 1, n); have = want; }
        }
        usleep(10000);
    }
}
