/*
 * sbx-reaper: become a child subreaper, then become the command.
 *
 *     sbx-reaper PROG ARGV0 [ARG...]
 *
 * init starts an exec that has a timeout through it: the flag survives
 * execve, so the command itself is the subreaper of whatever it starts,
 * and at the deadline init finds every process of the exec among the
 * command's descendants, those that left its session included (an orphan
 * would otherwise come to init and be lost among all of init's). It is
 * the one thing the agent's `exec --timeout` did that init cannot do from
 * outside, without the agent's price: a Go program's start, some 20 ms
 * in a sandbox; this one costs about one execve.
 *
 * No libc: a few system calls, so it builds with gcc alone (no
 * libc6-dev) and starts with nothing to initialise. PROG is a path init
 * has resolved already (as root: whether the user may run it is for the
 * execve to say). When it cannot become the command it says why on
 * stderr as init does for a command without a timeout, "sbx: ARGV0:
 * REASON", and exits as a shell would: 127 for a program not found, 126
 * for one that cannot run.
 */

#define PR_SET_CHILD_SUBREAPER 36
#define EPERM 1
#define ENOENT 2
#define ENOEXEC 8
#define EACCES 13

#if defined(__x86_64__)
#define SYS_write 1
#define SYS_prctl 157
#define SYS_execve 59
#define SYS_exit 60

static long sys3(long n, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c)
			 : "rcx", "r11", "memory");
	return ret;
}

/* the kernel leaves argc at the stack pointer, argv and envp after it */
__asm__(".text\n"
	".global _start\n"
	"_start:\n"
	"	mov %rsp, %rdi\n"
	"	and $-16, %rsp\n"
	"	call reaper\n"
	"	hlt\n");
#elif defined(__aarch64__)
#define SYS_write 64
#define SYS_prctl 167
#define SYS_execve 221
#define SYS_exit 93

static long sys3(long n, long a, long b, long c)
{
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
	return x0;
}

__asm__(".text\n"
	".global _start\n"
	"_start:\n"
	"	mov x0, sp\n"
	"	bl reaper\n");
#else
#error "sbx-reaper: no system calls written for this architecture"
#endif

static void say(const char *s)
{
	long n = 0;

	while (s[n])
		n++;
	sys3(SYS_write, 2, (long)s, n);
}

__attribute__((noreturn, used)) void reaper(long *sp)
{
	long argc = sp[0];
	char **argv = (char **)(sp + 1);
	char **envp = argv + argc + 1;
	long err;
	int code = 126;

	if (argc < 3) {
		say("usage: sbx-reaper PROG ARGV0 [ARG...]\n");
		for (;;)
			sys3(SYS_exit, 2, 0, 0);
	}
	/* best effort, as the agent's was: the command runs either way */
	sys3(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0);
	err = -sys3(SYS_execve, (long)argv[1], (long)(argv + 2), (long)envp);
	say("sbx: ");
	say(argv[2]);
	switch (err) {
	case ENOENT:
		say(": command not found\n");
		code = 127;
		break;
	case EACCES:
	case EPERM:
		say(": permission denied\n");
		break;
	case ENOEXEC:
		say(": cannot execute: exec format error\n");
		break;
	default:
		say(": cannot execute it\n");
	}
	for (;;)
		sys3(SYS_exit, code, 0, 0);
}
