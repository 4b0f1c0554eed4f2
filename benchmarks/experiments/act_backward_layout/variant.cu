// One block shape of the Linear backward's activation pass (kernels/linear_backward.cu),
// compiled with -DGEMMT_ACT_BACKWARD_COL_THREADS=C and its entry points renamed
// (-DVARIANT_RUN=..., -DVARIANT_WS=...), so that several shapes link into one program.
#define linear_backward_run VARIANT_RUN
#define linear_backward_workspace_bytes VARIANT_WS
#include "linear_backward.cu"
