/*
 * dlsym_x86_64.S — the exported dlsym of libkrex_shim (x86-64).
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
