/*
 * fuzz_main.h: what the fuzz targets share: CHECK, and with
 * OVL_FUZZ_STANDALONE a main() that replays inputs without libFuzzer, so
 * that ctest runs every target in every build (tests/CMakeLists.txt).
 *
 * A target defines FUZZ_NAME (its name, for messages) before including this
 * file, defines LLVMFuzzerTestOneInput and, under OVL_FUZZ_STANDALONE,
 *
 *     static void fuzz_builtin(void);
 *
 * which runs its built-in deterministic inputs through fuzz_run(). The
 * replay main takes files and directories (each regular file in a
 * directory, not recursing, names starting with '.' skipped) on the
 * command line, or with no arguments runs fuzz_builtin(). Each input is
 * run from a private heap copy of exactly its size, as libFuzzer does, so
 * that ASan catches a read past its end. Exit status: 0, or 1 if a file
 * could not be read; a failed CHECK aborts.
 */
#ifndef OVL_FUZZ_MAIN_H
#define OVL_FUZZ_MAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FUZZ_NAME
#error "define FUZZ_NAME before including fuzz_main.h"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Not assert(): checks must survive -DNDEBUG builds. The fuzzer reports an
 * abort like a crash. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, FUZZ_NAME ": check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#ifdef OVL_FUZZ_STANDALONE

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>

static void fuzz_builtin(void);

static size_t fuzz_nruns;

/* Runs one input from a private copy of exactly size bytes. */
static void fuzz_run(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    CHECK(copy != NULL);
    if (size)
        memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
    fuzz_nruns++;
}

static int fuzz_run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            CHECK(nb != NULL);
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        perror(path);
        free(buf);
        return 1;
    }
    fuzz_run(buf, len);
    free(buf);
    return 0;
}

static int fuzz_run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return fuzz_run_file(path);
    DIR *d = opendir(path);
    if (!d) {
        perror(path);
        return 1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sub[4096];
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        struct stat sst;
        if (stat(sub, &sst) == 0 && S_ISREG(sst.st_mode))
            rc |= fuzz_run_file(sub);
    }
    closedir(d);
    return rc;
}

/* Fixed-seed xorshift for the built-in sets: the same inputs on every run. */
static uint32_t fuzz_prng_state = 0x12345678u;

static uint32_t fuzz_prng(void)
{
    uint32_t x = fuzz_prng_state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return fuzz_prng_state = x;
}

int main(int argc, char **argv)
{
    clock_t t0 = clock();
    int rc = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            rc |= fuzz_run_path(argv[i]);
    } else {
        fuzz_builtin();
    }
    printf(FUZZ_NAME ": %zu inputs, %.2f s CPU%s\n", fuzz_nruns,
           (double)(clock() - t0) / CLOCKS_PER_SEC, rc ? ", some files unreadable" : "");
    return rc;
}

#endif /* OVL_FUZZ_STANDALONE */

#endif /* OVL_FUZZ_MAIN_H */
