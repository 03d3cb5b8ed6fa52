/* The shim's predicted online requests: the arbiter's grants learn from them (arbsched.c). */
#include "../shim/predict.c"
