/*
 * dl_x86_64.S — the exported dlsym, dlopen and dlmopen of libkrex_shim (x86-64).
 *
 * glibc's dlsym resolves RTLD_NEXT relative to the object that called it,
 * found from its return address.  A C wrapper that forwards with an
 * ordinary call makes the shim the caller, and a library asking for "the
 * next open after me" gets its own symbol back (an infinite recursion
 * seen in other interposers).  So this entry asks the C decision function
 * for a hook and, when there is none, tail-jumps to the real dlsym with
 * the original arguments and the original return address.
 *
 *   void *dlsym(void *handle, const char *name)
 *     hook = krex_dlsym_decide(handle, name)   (interpose.c)
 *     return hook ? hook : real_dlsym(handle, name)   -- as a jump
 */
        .text
        .hidden krex_dlsym_decide
        .hidden krex_real_dlsym_ptr
        .globl  dlsym
        .type   dlsym, @function
        .p2align 4
dlsym:
        .cfi_startproc
#ifdef __CET__
        endbr64
#endif
        /* Entry: %rsp = 8 mod 16.  Save the two arguments and realign. */
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp
        .cfi_adjust_cfa_offset 8
        call    krex_dlsym_decide
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testq   %rax, %rax
        jz      1f
        ret
1:
        /* krex_dlsym_decide() has set the pointer before returning. */
        jmp     *krex_real_dlsym_ptr(%rip)
        .cfi_endproc
        .size   dlsym, .-dlsym

/*
 * dlopen and dlmopen: glibc resolves a bare name through the *caller's*
 * RPATH/RUNPATH, expands $ORIGIN in a path relative to the caller, and
 * loads into the caller's namespace, all found from its return address.
 * So these entries, too, ask a C decision function (dlguard.c) and then
 * tail-jump to the real function with the original arguments and return
 * address; the decision gets that return address as its last argument
 * (to search as the loader will) and returns non-zero to refuse the call
 * (the entry then returns NULL; dlerror() was set by the decision).
 *
 *   void *dlopen(const char *file, int mode)
 *     if (krex_dlopen_decide(file, mode, caller)) return NULL;
 *     jump real_dlopen(file, mode)
 *   void *dlmopen(Lmid_t lmid, const char *file, int mode)
 *     if (krex_dlmopen_decide(lmid, file, mode, caller)) return NULL;
 *     jump real_dlmopen(lmid, file, mode)
 */
        .hidden krex_dlopen_decide
        .hidden krex_dlmopen_decide
        .hidden krex_real_dlopen_ptr
        .hidden krex_real_dlmopen_ptr

        .globl  dlopen
        .type   dlopen, @function
        .p2align 4
dlopen:
        .cfi_startproc
#ifdef __CET__
        endbr64
#endif
        /* Entry: %rsp = 8 mod 16; three pushes realign it.  The caller's
         * return address is then at 24(%rsp). */
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        pushq   %rdx
        .cfi_adjust_cfa_offset 8
        movq    24(%rsp), %rdx
        call    krex_dlopen_decide
        popq    %rdx
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testl   %eax, %eax
        jnz     1f
        /* krex_dlopen_decide() has set the pointer before returning. */
        jmp     *krex_real_dlopen_ptr(%rip)
1:
        xorl    %eax, %eax
        ret
        .cfi_endproc
        .size   dlopen, .-dlopen

        .globl  dlmopen
        .type   dlmopen, @function
        .p2align 4
dlmopen:
        .cfi_startproc
#ifdef __CET__
        endbr64
#endif
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        pushq   %rdx
        .cfi_adjust_cfa_offset 8
        movq    24(%rsp), %rcx
        call    krex_dlmopen_decide
        popq    %rdx
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testl   %eax, %eax
        jnz     1f
        jmp     *krex_real_dlmopen_ptr(%rip)
1:
        xorl    %eax, %eax
        ret
        .cfi_endproc
        .size   dlmopen, .-dlmopen

        .section .note.GNU-stack,"",@progbits

#ifdef __CET__
        /* Built with -fcf-protection: mark the object IBT/SHSTK compatible
         * (the entry starts with endbr64 and returns normally), so the
         * library keeps the marking of its C objects. */
        .section .note.gnu.property,"a"
        .p2align 3
        .long   4                       /* name size */
        .long   16                      /* descriptor size */
        .long   5                       /* NT_GNU_PROPERTY_TYPE_0 */
        .asciz  "GNU"
        .long   0xc0000002              /* GNU_PROPERTY_X86_FEATURE_1_AND */
        .long   4
        .long   __CET__                 /* 1: IBT, 2: SHSTK */
        .p2align 3
#endif
