// flood HOST PORT SECONDS PROCS: PROCS processes send UDP datagrams of 1
// and 1400 bytes to HOST:PORT as fast as they can for SECONDS, and open TCP
// connects (SYNs) to it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
// flood HOST PORT: one TCP connect, printing the milliseconds it took.
static int connectMs(struct sockaddr_in *a) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, (struct sockaddr *)a, sizeof *a) != 0) return 1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%ld\n", (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
  return 0;
}

int main(int argc, char **argv) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
  inet_pton(AF_INET, argv[1], &a.sin_addr);
  if (argc == 3) return connectMs(&a);
  int secs = atoi(argv[3]), procs = atoi(argv[4]);
  for (int p = 0; p < procs; p++) {
    if (fork() == 0) {
      int s = socket(AF_INET, SOCK_DGRAM, 0);
      char buf[1400] = {0};
      time_t end = time(NULL) + secs;
      long n = 0;
      while (time(NULL) < end) {
        sendto(s, buf, (n++ & 1) ? 1400 : 1, MSG_DONTWAIT, (struct sockaddr *)&a, sizeof a);
        if ((n & 1023) == 0) {
          int t = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
          connect(t, (struct sockaddr *)&a, sizeof a);
          close(t);
        }
      }
      _exit(0);
    }
  }
  while (wait(NULL) > 0) {}
  return 0;
}
