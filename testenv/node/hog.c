/* hog MIB [STEP_MS]: allocates MIB mebibytes one at a time (STEP_MS apart,
 * default 0), touching every page so it counts as the pod's working set, then
 * holds them until killed. The real node's memory-pressure demo and tests run
 * it in a pod to push the kubelet past its evictionHard memory.available. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: hog MIB [STEP_MS]\n");
    return 2;
  }
  long mib = atol(argv[1]);
  long step = argc > 2 ? atol(argv[2]) : 0;
  struct timespec ts = {step / 1000, (step % 1000) * 1000000L};
  for (long i = 0; i < mib; i++) {
    char *p = malloc(1 << 20);
    if (!p) {
      fprintf(stderr, "hog: malloc failed after %ld MiB\n", i);
      break;
    }
    memset(p, 1, 1 << 20);
    if (step) nanosleep(&ts, NULL);
  }
  printf("ALLOCATED %ld MiB\n", mib);
  fflush(stdout);
  signal(SIGTERM, SIG_DFL);
  for (;;) pause();
}
