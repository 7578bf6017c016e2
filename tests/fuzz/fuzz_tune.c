/*
 * fuzz_tune.c: libFuzzer target for the text of auto's tuning table
 * (ovld_tune_load, daemon/core/tune.c), which ovld reads from its state
 * directory at every start. ovld wrote the file, but a disk, an operator's
 * editor or another version may have changed it: every byte is untrusted.
 *
 * Input: the file's bytes, read for the device "fuzz dev" (the first line
 * must name it for anything to load).
 *
 * Properties (any failure aborts):
 * - at most the table's size is taken, and taken + skipped is at most the
 *   lines after the first;
 * - every key taken plans its choice: the table formats, and its text
 *   loads again into a new table whole (the same keys, none skipped), and
 *   formats to the same text (a fixed point);
 * - the skip message, when there is one, is NUL-terminated in its buffer;
 * - the same input into a table of one entry takes at most one key.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune.h"

#define FUZZ_NAME "fuzz_tune"
#include "fuzz_main.h"

#define DEVICE  "fuzz dev"
#define ENTRIES 16u

static char *format(const ovld_tune_t *t, size_t *len)
{
    *len = ovld_tune_format(t, DEVICE, false, NULL, 0);
    char *s = malloc(*len + 1);
    CHECK(s != NULL);
    CHECK(ovld_tune_format(t, DEVICE, false, s, *len + 1) == *len);
    /* a loaded table has chosen keys only: the state file's text is the same */
    CHECK(ovld_tune_format(t, DEVICE, true, NULL, 0) == *len);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ovld_tune_t *t = ovld_tune_create(3, ENTRIES, 0);
    CHECK(t != NULL);
    size_t skipped = 0, lines = 0;
    char why[128];
    memset(why, 'x', sizeof(why));
    size_t taken = ovld_tune_load(t, DEVICE, (const char *)data, size, &skipped, why, sizeof(why));
    CHECK(memchr(why, '\0', sizeof(why)) != NULL);
    CHECK(taken <= ENTRIES && ovld_tune_size(t) == taken && ovld_tune_chosen(t) == taken);
    for (size_t i = 0; i < size; i++)
        lines += data[i] == '\n';
    CHECK(taken + skipped <= lines + 1);

    size_t len, len2;
    char *text = format(t, &len);
    ovld_tune_t *u = ovld_tune_create(3, ENTRIES, 0);
    CHECK(u != NULL);
    CHECK(ovld_tune_load(u, DEVICE, text, len, &skipped, why, sizeof(why)) == taken);
    CHECK(skipped == 0);
    char *text2 = format(u, &len2);
    CHECK(len2 == len && memcmp(text, text2, len) == 0);

    ovld_tune_t *one = ovld_tune_create(3, 1, 0);
    CHECK(one != NULL);
    CHECK(ovld_tune_load(one, DEVICE, (const char *)data, size, NULL, why, sizeof(why)) <= 1);

    free(text2);
    free(text);
    ovld_tune_destroy(one);
    ovld_tune_destroy(u);
    ovld_tune_destroy(t);
    return 0;
}

#ifdef OVL_FUZZ_STANDALONE
/* Valid tables and their damaged forms, deterministic. */
static void fuzz_builtin(void)
{
    static const char *const texts[] = {
        "ovld-tune 1 fuzz dev\n",
        "ovld-tune 1 fuzz dev\nkind=ag_gemm world=2 m=32 n=16 k=24 dtype=bf16 transb=0 a_out=0 "
        "strided=0 shared_gpu=0 allgather=auto chose=ring/2 ns=naive/0:90,ring/2:10\n",
        "ovld-tune 1 fuzz dev\nkind=gemm_rs world=4 m=2048 n=512 k=512 dtype=fp16 transb=1 a_out=0 "
        "strided=0 shared_gpu=1 allgather=copy reduce=avg chose=push/4 "
        "ns=ring/0:70,push/0:60!,push/4:50\n",
        "ovld-tune 1 fuzz dev\nkind=ag_gemm world=2 m=256 n=64,32,16 k=128 dtype=fp8e4m3 transb=1 "
        "a_out=0 strided=0 shared_gpu=0 allgather=nccl b_dtype=fp8e5m2 out_dtype=fp16 "
        "a_mode=1x128 b_mode=128x128 fast_accum=0 bias=1 chose=ring/0 "
        "ns=ring/0:5,naive/0:9\n",
        "ovld-tune 1 fuzz dev\nkind=ag_gemm world=2 m=32 n=16 k=24 chose=- ns=ring/0:0 measuring\n",
        "ovld-tune 1 other dev\nkind=ag_gemm world=2 m=32 n=16 k=24 dtype=bf16 chose=ring/0 "
        "ns=ring/0:1,naive/0:2\n",
    };
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        size_t n = strlen(texts[i]);
        fuzz_run((const uint8_t *)texts[i], n);
        for (size_t cut = 0; cut < n; cut += 7)
            fuzz_run((const uint8_t *)texts[i], cut);
        char *m = malloc(n);
        CHECK(m != NULL);
        for (int round = 0; round < 400; round++) {
            memcpy(m, texts[i], n);
            for (int f = 0; f < 1 + round % 3; f++) {
                uint32_t x = fuzz_prng();
                m[x % n] = (char)(x >> 24);
            }
            fuzz_run((const uint8_t *)m, n);
        }
        free(m);
    }
}
#endif
