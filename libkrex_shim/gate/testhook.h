/*
 * testhook.h — named pause points for deterministic race tests.
 *
 * KREX_TEST_POINT("name") marks a place between two statements where a race
 * with another thread or process matters.  In the normal libraries it
 * compiles to nothing; in the test variants (-DKREX_TEST_HOOKS:
 * libkrex_gate_test.so, libkrex_shim_test.so, never installed) a thread
 * reaching the point named by KREX_TEST_PAUSE pauses there (below), so a
 * test can run the competing step at exactly that moment
 * (tests/shim/test_gate_races.py).
 */
#ifndef KREX_TESTHOOK_H
#define KREX_TESTHOOK_H

#ifdef KREX_TEST_HOOKS
/* KREX_TEST_PAUSE=name: the point to pause at (first arrival only);
 * KREX_TEST_PAUSE_FILE=path: created (holding the pid) on arrival, and the
 * thread waits until the test removes it (giving up after 60 s, so a broken
 * test cannot hang); KREX_TEST_PAUSE_ARM=path (optional): the point pauses
 * only while this file exists; KREX_TEST_PAUSE_SKIP=N (optional): the first
 * N (armed) arrivals pass. */
void krex_test_point(const char *name);
#define KREX_TEST_POINT(name) krex_test_point(name)
#else
#define KREX_TEST_POINT(name) ((void)0)
#endif

#endif /* KREX_TESTHOOK_H */
