/* The shim's predicted online requests: the arbiter's grants learn from them (arbiter.c). */
#include "../shim/predict.c"
