/*
 * dl_open — dlopen/dlmopen through the shim's entries (tests/shim/test_dlopen.py).
 *
 *   dl_open HOW NAME [deepbind]
 *
 * HOW: "caller" (dlopen from libdlo_caller.so, whose RUNPATH finds NAME),
 * "main" (dlopen from this program), "mcaller" (dlmopen(LM_ID_NEWLM) from
 * libdlo_caller.so), "mmain" (dlmopen(LM_ID_NEWLM) from this program).
 * Mode RTLD_NOW, plus RTLD_GLOBAL for "main" without deepbind, plus
 * RTLD_DEEPBIND with "deepbind".  Prints one JSON line:
 *   {"loaded": 0|1, "call": <dlo_plain()/dlo_user() or -1>, "error": "<dlerror()>"}
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

void *dlo_open(const char *name, int mode);
void *dlo_mopen(const char *name, int mode);

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *how = argv[1], *name = argv[2];
    int deep = argc > 3 && !strcmp(argv[3], "deepbind");
    int mode = RTLD_NOW | (deep ? RTLD_DEEPBIND : 0);
    void *h;
    if (!strcmp(how, "caller"))
        h = dlo_open(name, mode);
    else if (!strcmp(how, "mcaller"))
        h = dlo_mopen(name, mode);
    else if (!strcmp(how, "mmain"))
        h = dlmopen(LM_ID_NEWLM, name, mode);
    else
        h = dlopen(name, mode | (deep ? 0 : RTLD_GLOBAL));
    const char *err = h ? "" : dlerror();
    int call = -1;
    if (h) {
        int (*f)(void) = (int (*)(void))dlsym(h, "dlo_plain");
        if (!f)
            f = (int (*)(void))dlsym(h, "dlo_user");
        call = f ? f() : -1;
    }
    printf("{\"loaded\": %d, \"call\": %d, \"error\": \"", h != NULL, call);
    for (const char *p = err ? err : ""; *p; p++)
        if (*p != '"' && *p != '\\')
            putchar(*p);
    printf("\"}\n");
    return 0;
}
