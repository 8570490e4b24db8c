/* A rank of a job, in plain C over an installed muster: joins the world
 * that muster-run describes in the environment (RANK, WORLD_SIZE, ...), and
 * all-reduces (SUM) a vector of its rank + 1. Prints "RANK r OK sum=S" and
 * exits 0 when every element is 1 + 2 + ... + world size. */
#include <muster/muster.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char* what, int code) {
  fprintf(stderr, "allreduce_c: %s: %s: %s\n", what, muster_code_name(code), muster_last_error());
  return 1;
}

int main(void) {
  if (muster_api_version() != MUSTER_C_API_VERSION) {
    fprintf(stderr, "allreduce_c: library C API %d, header %d\n", muster_api_version(),
            MUSTER_C_API_VERSION);
    return 1;
  }
  muster_init_options options;
  muster_init_options_default(&options);
  muster_world* world = NULL;
  int code = muster_world_init(&options, &world);
  if (code != MUSTER_OK) return fail("muster_world_init", code);
  int rank = muster_world_rank(world);
  int size = muster_world_size(world);

  double values[4];
  for (int i = 0; i < 4; ++i) values[i] = rank + 1;
  muster_tensor tensor;
  memset(&tensor, 0, sizeof(tensor));
  tensor.data = values;
  tensor.count = 4;
  tensor.dtype = MUSTER_FLOAT64;
  tensor.device = MUSTER_DEVICE_CPU;
  muster_group* group = muster_world_group(world); /* a new reference */
  muster_work* work = NULL;
  code = muster_all_reduce(group, &tensor, MUSTER_SUM, 1.0, &work);
  if (code != MUSTER_OK) return fail("muster_all_reduce", code);
  code = muster_work_wait(work, 60.0);
  muster_work_release(work);
  if (code != MUSTER_OK) return fail("muster_work_wait", code);

  double want = size * (size + 1) / 2.0;
  for (int i = 0; i < 4; ++i) {
    if (values[i] != want) {
      fprintf(stderr, "allreduce_c: element %d is %g, want %g\n", i, values[i], want);
      return 1;
    }
  }
  printf("RANK %d OK sum=%g lang=c version=%s\n", rank, values[0], muster_version());
  muster_group_release(group);
  muster_world_release(world);
  return 0;
}
