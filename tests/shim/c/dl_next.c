/*
 * dl_next — dlsym(RTLD_NEXT, ...) must resolve relative to its real caller.
 *
 * Linked against libprobe_a.so then libprobe_b.so; both define probe_id().
 * libprobe_a's probe_next() asks for the probe_id after its own and must
 * get b's.  A dlsym override that forwarded with an ordinary call would make
 * itself the caller and hand back a's own probe_id (the recursion other
 * interposers shipped).  Prints "next=<id>".
 */
#include <stdio.h>

const char *probe_next(void);

int main(void)
{
    printf("next=%s\n", probe_next());
    return 0;
}
