/*
 * RTLD_NEXT through the dlsym override (tests/integration/test_shim.py).  Built three times:
 *   -DLIB_A: libnexta.so, defines sgt_sym() = 1 and sgt_next() = dlsym(RTLD_NEXT, "sgt_sym")()
 *   -DLIB_B: libnextb.so, defines sgt_sym() = 2
 *   (none): the program, which prints next=<what sgt_next returned>
 * With LD_PRELOAD="libsharegpu.so libnexta.so libnextb.so" the answer must be 2: RTLD_NEXT is
 * relative to libnexta (the caller), not to the shim whose dlsym forwarded the call.
 */
#include <dlfcn.h>
#include <stdio.h>

#if defined(LIB_A)
__attribute__((visibility("default"))) int sgt_sym(void) { return 1; }
__attribute__((visibility("default"))) int sgt_next(void)
{
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "sgt_sym");
    return f ? f() : -1;
}
#elif defined(LIB_B)
__attribute__((visibility("default"))) int sgt_sym(void) { return 2; }
#else
int main(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "sgt_next");
    printf("next=%d\n", next ? next() : -1);
    return 0;
}
#endif
