/* optim_driver.c - runs trainyard's AdamW, schedule and clipping over
 * gradients given in a file, for tests/numerics/optim_ref.py to compare
 * with torch.optim.AdamW.
 *
 * usage: optim_driver IN OUT n steps lr weight_decay warmup grad_clip grad_scale
 * IN holds float32 params[n] then grads[steps][n]; OUT receives, per step,
 * float64 lr and the global norm before clipping, then float32 params[n]
 * after the last step. */
#include <stdio.h>
#include <stdlib.h>

#include "worker/model/optim.h"

int main(int argc, char **argv) {
  if (argc != 10) {
    fprintf(stderr, "usage: optim_driver IN OUT n steps lr wd warmup clip scale\n");
    return 2;
  }
  size_t n = strtoull(argv[3], NULL, 10);
  int steps = atoi(argv[4]);
  optim_config_t c;
  optim_config_defaults(&c);
  c.lr = atof(argv[5]);
  c.weight_decay = atof(argv[6]);
  c.warmup_steps = atoi(argv[7]);
  c.total_steps = steps;
  double clip = atof(argv[8]), scale = atof(argv[9]);
  FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
  if (!in || !out) {
    perror("optim_driver");
    return 1;
  }
  float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
  char msg[256];
  optim_t *o = optim_new(&c, n, msg, sizeof msg);
  if (!p || !g || !o || fread(p, sizeof *p, n, in) != n) {
    fprintf(stderr, "optim_driver: %s\n", o ? "short input" : msg);
    return 1;
  }
  for (int s = 0; s < steps; s++) {
    if (fread(g, sizeof *g, n, in) != n) {
      fprintf(stderr, "optim_driver: short input at step %d\n", s);
      return 1;
    }
    /* The norm of the scaled gradient is what clipping sees. */
    double norm = scale * __builtin_sqrt(optim_sumsq(g, n));
    double lr = optim_lr_at(&c, s);
    optim_step(o, p, g, lr, scale * optim_clip_factor(norm, clip));
    fwrite(&lr, sizeof lr, 1, out);
    fwrite(&norm, sizeof norm, 1, out);
  }
  fwrite(p, sizeof *p, n, out);
  fclose(in);
  optim_free(o);
  free(p);
  free(g);
  return fclose(out) ? 1 : 0;
}
