/* Whether this process may use AMX tiles: Linux hands out the tile state on request
 * (arch_prctl ARCH_REQ_XCOMP_PERM); where it refuses, or the build lacks AMX, the answer is 0
 * and the kernels keep their vdpbf16ps paths. */
#include "amx.h"

#ifdef JR_AMX
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int amx_ready(void) {
    static int granted = -1; /* asked once a process; the answer holds for every thread */
    if (granted < 0)
        granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return granted;
}
#else
int amx_ready(void) { return 0; }
#endif
