#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <errno.h>
int main(int argc, char **argv) {
  const char *m = argv[1];
  int sig = argc > 2 ? atoi(argv[2]) : SIGKILL;
  if (!strcmp(m, "fasync")) {
    int p[2]; if (pipe(p)) { perror("pipe"); return 2; }
    if (fcntl(p[0], F_SETOWN, 1) < 0) { printf("setown rc=%d\n", errno); return 0; }
    if (fcntl(p[0], F_SETSIG, sig) < 0) { printf("setsig rc=%d\n", errno); return 0; }
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_ASYNC);
    write(p[1], "x", 1);
    printf("fasync sent %d\n", sig);
  } else if (!strcmp(m, "attach")) {
    long r = ptrace(PTRACE_ATTACH, 1, 0, 0);
    printf("attach r=%ld errno=%d\n", r, r ? errno : 0); fflush(stdout);
    if (r == 0) sleep(atoi(argv[2]));
  } else if (!strcmp(m, "seize")) {
    long r = ptrace(PTRACE_SEIZE, 1, 0, 0);
    printf("seize r=%ld errno=%d\n", r, r ? errno : 0);
    r = ptrace(PTRACE_INTERRUPT, 1, 0, 0);
    printf("interrupt r=%ld errno=%d\n", r, r ? errno : 0); fflush(stdout);
    sleep(atoi(argv[2]));
  } else if (!strcmp(m, "mem")) {
    int fd = open("/proc/1/mem", O_RDWR);
    printf("mem open fd=%d errno=%d\n", fd, fd < 0 ? errno : 0);
  } else if (!strcmp(m, "vm")) {
    char b[1]; struct iovec l = {b, 1}, r = {(void*)0x1000, 1};
    long n = syscall(SYS_process_vm_readv, 1, &l, 1, &r, 1, 0);
    printf("vm n=%ld errno=%d\n", n, n < 0 ? errno : 0);
  } else if (!strcmp(m, "pidfd")) {
    int fd = syscall(SYS_pidfd_open, 1, 0);
    long r = syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
    printf("pidfd fd=%d r=%ld errno=%d\n", fd, r, r ? errno : 0);
  } else if (!strcmp(m, "queue")) {
    int codes[] = {0, 0x80, 1, -1, -6};
    for (int i = 0; i < 5; i++) {
      siginfo_t si; memset(&si, 0, sizeof si);
      si.si_signo = sig; si.si_code = codes[i]; si.si_pid = 0;
      long r = syscall(SYS_rt_sigqueueinfo, 1, sig, &si);
      long r2 = syscall(SYS_rt_tgsigqueueinfo, 1, 1, sig, &si);
      printf("code %d: q=%ld/%d tgq=%ld\n", codes[i], r, r ? errno : 0, r2);
    }
  } else if (!strcmp(m, "sigs")) {
    // every signal not at its default disposition, and the blocked ones
    sigset_t blk; sigprocmask(SIG_BLOCK, NULL, &blk);
    int bad = 0;
    for (int s = 1; s < 65; s++) {
      struct sigaction sa;
      if (s == SIGKILL || s == SIGSTOP || sigaction(s, NULL, &sa) != 0) continue;
      if (sa.sa_handler != SIG_DFL) { printf("signal %d: %s\n", s, sa.sa_handler == SIG_IGN ? "ignored" : "caught"); bad++; }
      if (sigismember(&blk, s) == 1) { printf("signal %d: blocked\n", s); bad++; }
    }
    printf("sigs-not-default=%d\n", bad);
  } else if (!strcmp(m, "sched")) {
    // niceness, affinity and policy of init (harmless if they succeed)
    cpu_set_t c; CPU_ZERO(&c); CPU_SET(0, &c);
    struct sched_param sp = {0};
    printf("sched prio=%d aff=%d idle=%d\n", setpriority(PRIO_PROCESS, 1, 19),
           sched_setaffinity(1, sizeof c, &c), sched_setscheduler(1, SCHED_IDLE, &sp));
  } else if (!strcmp(m, "getfd")) {
    int fd = syscall(SYS_pidfd_open, 1, 0), got = -1;
    for (int i = 0; i < 64 && got < 0; i++) got = syscall(SYS_pidfd_getfd, fd, i, 0);
    printf("getfd got=%d errno=%d\n", got, got < 0 ? errno : 0);
  } else if (!strcmp(m, "rlimit")) {
    struct rlimit r = {atoi(argv[3]), atoi(argv[3])};
    int res = !strcmp(argv[2], "nofile") ? RLIMIT_NOFILE : !strcmp(argv[2], "cpu") ? RLIMIT_CPU : RLIMIT_AS;
    int rc = prlimit(1, res, &r, NULL);
    printf("prlimit %s rc=%d errno=%d\n", argv[2], rc, rc ? errno : 0);
  }
  return 0;
}
