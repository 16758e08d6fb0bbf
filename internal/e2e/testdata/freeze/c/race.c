/* The C acceptance test of hunt --freeze: a server answering a random
 * token, the token in a local variable, and a seeded race that ends in a
 * NULL dereference now and then; the SIGSEGV handler calls the freeze
 * command, then dies of the signal as it would have. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PORT 8767

static char served[64];
static volatile int *ready;
static int one = 1;

static void *serve(void *arg) {
	int ln = *(int *)arg;
	for (;;) {
		int c = accept(ln, NULL, NULL);
		if (c < 0)
			continue;
		char buf[512];
		(void)read(c, buf, sizeof buf);
		char resp[256];
		int n = snprintf(resp, sizeof resp, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\ntoken=%s\n", served);
		(void)write(c, resp, n);
		close(c);
	}
	return NULL;
}

static void on_segv(int sig) {
	/* freeze here, in the handler, the faulting frame under it */
	pid_t p = fork();
	if (p == 0) {
		execl("/.sbx/freeze", "freeze", "--reason", "SIGSEGV", (char *)NULL);
		_exit(127);
	}
	if (p > 0) {
		int st;
		while (waitpid(p, &st, 0) < 0)
			;
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

static void *worker(void *arg) {
	usleep(*(int *)arg);
	ready = &one;
	return NULL;
}

static int check(char *token, int wait) {
	usleep(wait);
	return *ready + (int)strlen(token); /* FAIL_LINE */
}

int main(void) {
	signal(SIGSEGV, on_segv);
	unsigned seed = (unsigned)strtoul(getenv("SEED") ? getenv("SEED") : "0", NULL, 10);
	srand(seed);
	int worker_us = rand() % 20000, wait_us = rand() % 20000;

	char token[17];
	FILE *r = fopen("/dev/urandom", "r");
	unsigned char b[8];
	if (r == NULL || fread(b, 1, 8, r) != 8)
		return 2;
	fclose(r);
	for (int i = 0; i < 8; i++)
		sprintf(token + 2 * i, "%02x", b[i]);
	strcpy(served, token);

	int ln = socket(AF_INET, SOCK_STREAM, 0);
	int on = 1;
	setsockopt(ln, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(ln, (struct sockaddr *)&a, sizeof a) < 0 || listen(ln, 16) < 0) {
		perror("listen");
		return 2;
	}
	pthread_t s, w;
	pthread_create(&s, NULL, serve, &ln);
	pthread_create(&w, NULL, worker, &worker_us);
	int got = check(token, wait_us);
	pthread_join(w, NULL);
	printf("ok %d\n", got);
	return 0;
}
