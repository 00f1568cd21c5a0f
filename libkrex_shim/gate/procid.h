/*
 * procid.h — process identities as krexd reads them (procid.c): start
 * times (/proc/<pid>/stat field 22) in the initial pid and time
 * namespaces.  Internal to both libraries, not installed.
 */
#ifndef KREX_PROCID_H
#define KREX_PROCID_H

#include <stdint.h>

/* The caller's own start time, 0 when it cannot be read. */
uint64_t krex_self_start_ticks(void);
/* Process `pid` of the caller's pid namespace: 0 (ticks 0 when its time
 * cannot be normalised), -ENOENT when it is gone, -EINVAL when it cannot be
 * told. */
int krex_proc_start(int32_t pid, uint64_t *ticks, int *zombie);

#endif /* KREX_PROCID_H */
