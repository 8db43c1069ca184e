/*
 * test.h: the harness of BSPonMPI's API tests (../shared/bsplib-conformance)
 * for bspweb. Compile a test with
 *
 *     bspweb cc -I guest-c/conformance TEST.c -o TEST.wasm
 *
 * and run it with the process count of tests.txt.
 *
 * TEST(name, success()) or TEST(name, abort("message")) defines main, which
 * runs the test's body. A failed EXPECT prints a line starting with
 * "TEST FAILED" and ends the job with status 1. A test expected to abort that
 * finishes its body prints "TEST FAILED: expected an abort" instead. The
 * expected outcome is taken as text (the macro stringizes it), so `abort`
 * here never clashes with the C library's abort().
 */
#ifndef BSPWEB_CONFORMANCE_TEST_H
#define BSPWEB_CONFORMANCE_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_FAIL_(...)                                                  \
    do {                                                                 \
        printf("TEST FAILED: %s:%d: ", __FILE__, __LINE__);              \
        printf(__VA_ARGS__);                                             \
        printf("\n");                                                    \
        fflush(stdout);                                                  \
        exit(1);                                                         \
    } while (0)

#define EXPECT(cond)                                                     \
    do {                                                                 \
        if (!(cond)) TEST_FAIL_("expected %s", #cond);                   \
    } while (0)

#define EXPECT_EQ(fmt, a, b)                                             \
    do {                                                                 \
        if (!((a) == (b)))                                               \
            TEST_FAIL_("expected %s == %s, but " fmt " != " fmt, #a, #b, (a), (b)); \
    } while (0)

#define EXPECT_OP(fmt, a, op, b)                                         \
    do {                                                                 \
        if (!((a) op (b)))                                               \
            TEST_FAIL_("expected %s %s %s, but " fmt " vs " fmt, #a, #op, #b, (a), (b)); \
    } while (0)

#define EXPECT_IMPLIES(a, b)                                             \
    do {                                                                 \
        if ((a) && !(b)) TEST_FAIL_("expected %s to imply %s", #a, #b);  \
    } while (0)

#define TEST(name, expected)                                             \
    static void test_body_##name(void);                                  \
    int main(void) {                                                     \
        const char *expect = #expected;                                  \
        test_body_##name();                                              \
        if (strncmp(expect, "abort", 5) == 0)                            \
            TEST_FAIL_("%s: expected an abort: %s", #name, expect);       \
        return 0;                                                        \
    }                                                                    \
    static void test_body_##name(void)

#endif
