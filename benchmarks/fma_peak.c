/* fp32 FMA throughput of this CPU: 24 independent chains of the widest vector FMA, on N threads.
 * Built by benchmarks/peak.py with -O2 -march=native; prints GFLOP/s. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef float vec __attribute__((vector_size(64)));  /* 16 lanes: one zmm, or two ymm without AVX-512 */
#define ITERS 50000000L
#define CHAINS 24

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *out) {
  vec acc[CHAINS];
  for (int c = 0; c < CHAINS; c++) acc[c] = (vec){0} + 0.001f * (float)(c + 1);
  vec x = (vec){0} + 0.999999f, y = (vec){0} + 1e-7f;
  for (long n = 0; n < ITERS; n++) {
#pragma GCC unroll 24
    for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * x + y;
  }
  vec sum = acc[0];
  for (int c = 1; c < CHAINS; c++) sum += acc[c];
  *(float *)out = sum[0] + sum[15];
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > 256) return 2;
  pthread_t *ids = malloc(sizeof(pthread_t) * threads);
  float *sink = malloc(sizeof(float) * threads);
  double t = now();
  for (int i = 0; i < threads; i++) pthread_create(&ids[i], NULL, run, &sink[i]);
  for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL);
  double dt = now() - t;
  double flop = (double)threads * ITERS * CHAINS * 16 * 2;
  printf("%.1f %f\n", flop / dt / 1e9, sink[0]);
  return 0;
}
