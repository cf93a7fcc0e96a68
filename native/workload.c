/*
 * slabtune guest workload: message passing between groups of processes, to drive the
 * kernel's slab caches (socket buffers: skbuff_head_cache and the kmalloc caches holding
 * skb data; pipe buffers; task and file structures for the forked processes).
 *
 * Modes:
 *   hackbench  each group has F receivers and F senders; every sender writes LOOPS
 *              messages of SIZE bytes to every receiver of its group.
 *   crosscpu   each group is one sender pinned to CPU a and one receiver pinned to CPU b
 *              (b != a when more than one CPU is online).  Over a socket the sender's CPU
 *              allocates each skb and the receiver's CPU frees it, so every free is a
 *              remote (cross-CPU) free for the allocator.
 *
 * Transport: AF_UNIX stream socketpairs (default) or pipes.
 * Output: one JSON line on stdout with the wall time measured around the message phase.
 * Exit status: 0 on success, 2 on bad arguments, 1 on a system error.
 *
 * Built static (gcc -static -O2) so it runs from a busybox initramfs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_GROUPS 256
#define MAX_FDS 64
#define MAX_SIZE (1 << 20)

enum mode { MODE_HACKBENCH, MODE_CROSSCPU };
enum transport { T_SOCKET, T_PIPE };

struct options {
	enum mode mode;
	enum transport transport;
	long groups;
	long fds;
	long loops;
	long size;
	long cpu_a; /* -1: choose per group */
	long cpu_b;
};

static void usage(const char *why)
{
	fprintf(stderr, "workload: %s\n", why);
	fprintf(stderr,
		"usage: workload [--mode hackbench|crosscpu] [--transport socket|pipe]\n"
		"                [--groups N] [--fds N] [--loops N] [--size BYTES]\n"
		"                [--cpu-a N --cpu-b N]\n");
	exit(2);
}

static long parse_long(const char *name, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "workload: %s: %s is not an integer in %ld..%ld\n", name, s, lo, hi);
		exit(2);
	}
	return v;
}

static void parse_args(int argc, char **argv, struct options *o)
{
	int i;

	o->mode = MODE_HACKBENCH;
	o->transport = T_SOCKET;
	o->groups = 2;
	o->fds = 4;
	o->loops = 100;
	o->size = 100;
	o->cpu_a = -1;
	o->cpu_b = -1;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			usage("help");
		if (!v)
			usage("every option takes a value");
		if (!strcmp(a, "--mode")) {
			if (!strcmp(v, "hackbench"))
				o->mode = MODE_HACKBENCH;
			else if (!strcmp(v, "crosscpu"))
				o->mode = MODE_CROSSCPU;
			else
				usage("--mode: expected hackbench or crosscpu");
		} else if (!strcmp(a, "--transport")) {
			if (!strcmp(v, "socket"))
				o->transport = T_SOCKET;
			else if (!strcmp(v, "pipe"))
				o->transport = T_PIPE;
			else
				usage("--transport: expected socket or pipe");
		} else if (!strcmp(a, "--groups")) {
			o->groups = parse_long("--groups", v, 1, MAX_GROUPS);
		} else if (!strcmp(a, "--fds")) {
			o->fds = parse_long("--fds", v, 1, MAX_FDS);
		} else if (!strcmp(a, "--loops")) {
			o->loops = parse_long("--loops", v, 1, 100000000L);
		} else if (!strcmp(a, "--size")) {
			o->size = parse_long("--size", v, 1, MAX_SIZE);
		} else if (!strcmp(a, "--cpu-a")) {
			o->cpu_a = parse_long("--cpu-a", v, 0, CPU_SETSIZE - 1);
		} else if (!strcmp(a, "--cpu-b")) {
			o->cpu_b = parse_long("--cpu-b", v, 0, CPU_SETSIZE - 1);
		} else {
			usage("unknown option");
		}
		i++;
	}
	if ((o->cpu_a < 0) != (o->cpu_b < 0))
		usage("--cpu-a and --cpu-b go together");
}

static void die(const char *what)
{
	fprintf(stderr, "workload: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A one-directional channel: wr for senders, rd for the receiver. */
static void make_channel(enum transport t, int *rd, int *wr)
{
	int fds[2];

	if (t == T_SOCKET) {
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) < 0)
			die("socketpair");
	} else {
		if (pipe(fds) < 0)
			die("pipe");
	}
	*rd = fds[0];
	*wr = fds[1];
}

static void pin(long cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET((int)cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0)
		die("sched_setaffinity");
}

/* Block until the parent closes the start pipe. */
static void wait_start(int start_rd)
{
	char c;

	while (read(start_rd, &c, 1) < 0 && errno == EINTR)
		;
}

static void writen(int fd, const char *buf, long n)
{
	while (n > 0) {
		ssize_t w = write(fd, buf, (size_t)n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			die("write");
		}
		buf += w;
		n -= w;
	}
}

static void receiver(int fd, long expect_bytes, long size)
{
	char *buf = malloc((size_t)size);
	long got = 0;

	if (!buf)
		die("malloc");
	while (got < expect_bytes) {
		ssize_t r = read(fd, buf, (size_t)size);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read");
		}
		if (r == 0) {
			fprintf(stderr, "workload: receiver saw EOF after %ld of %ld bytes\n", got,
				expect_bytes);
			exit(1);
		}
		got += r;
	}
	free(buf);
}

static void sender(const int *fds, long nfds, long loops, long size)
{
	char *buf = malloc((size_t)size);
	long i, j;

	if (!buf)
		die("malloc");
	memset(buf, 'x', (size_t)size);
	for (i = 0; i < loops; i++)
		for (j = 0; j < nfds; j++)
			writen(fds[j], buf, size);
	free(buf);
}

static pid_t spawn(int start_rd, int start_wr, long cpu)
{
	pid_t pid = fork();

	if (pid < 0)
		die("fork");
	if (pid == 0) {
		close(start_wr);
		pin(cpu);
		wait_start(start_rd);
	}
	return pid;
}

static long online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n > 0 ? n : 1;
}

int main(int argc, char **argv)
{
	struct options o;
	int start[2];
	pid_t pids[MAX_GROUPS * MAX_FDS * 2];
	long npids = 0, g, r, s, ncpu = online_cpus();
	long per_group_senders, per_group_receivers, messages;
	double t0, t1;
	int status, failed = 0;

	parse_args(argc, argv, &o);
	if (o.mode == MODE_CROSSCPU) {
		per_group_senders = 1;
		per_group_receivers = 1;
	} else {
		per_group_senders = o.fds;
		per_group_receivers = o.fds;
	}
	if (pipe(start) < 0)
		die("pipe");

	for (g = 0; g < o.groups; g++) {
		int rd[MAX_FDS], wr[MAX_FDS];
		long cpu_a = -1, cpu_b = -1;

		if (o.mode == MODE_CROSSCPU) {
			if (o.cpu_a >= 0) {
				cpu_a = o.cpu_a;
				cpu_b = o.cpu_b;
			} else {
				cpu_a = g % ncpu;
				cpu_b = (g + 1) % ncpu;
			}
		}
		for (r = 0; r < per_group_receivers; r++)
			make_channel(o.transport, &rd[r], &wr[r]);
		for (r = 0; r < per_group_receivers; r++) {
			pid_t pid = spawn(start[0], start[1], cpu_b);

			if (pid == 0) {
				long k;

				for (k = 0; k < per_group_receivers; k++) {
					close(wr[k]);
					if (k != r)
						close(rd[k]);
				}
				receiver(rd[r], per_group_senders * o.loops * o.size, o.size);
				_exit(0);
			}
			pids[npids++] = pid;
		}
		for (s = 0; s < per_group_senders; s++) {
			pid_t pid = spawn(start[0], start[1], cpu_a);

			if (pid == 0) {
				long k;

				for (k = 0; k < per_group_receivers; k++)
					close(rd[k]);
				sender(wr, per_group_receivers, o.loops, o.size);
				_exit(0);
			}
			pids[npids++] = pid;
		}
		for (r = 0; r < per_group_receivers; r++) {
			close(rd[r]);
			close(wr[r]);
		}
	}

	close(start[0]);
	t0 = now();
	close(start[1]); /* every child's read() returns 0: go */
	for (g = 0; g < npids; g++) {
		if (waitpid(pids[g], &status, 0) < 0)
			die("waitpid");
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed++;
	}
	t1 = now();
	if (failed) {
		fprintf(stderr, "workload: %d of %ld processes failed\n", failed, npids);
		return 1;
	}

	messages = o.groups * per_group_senders * per_group_receivers * o.loops;
	printf("{\"workload\": \"slabtune\", \"mode\": \"%s\", \"transport\": \"%s\", "
	       "\"groups\": %ld, \"fds\": %ld, \"loops\": %ld, \"msg_size\": %ld, "
	       "\"processes\": %ld, \"cpus_online\": %ld, \"messages\": %ld, \"bytes\": %ld, "
	       "\"wall_s\": %.6f}\n",
	       o.mode == MODE_CROSSCPU ? "crosscpu" : "hackbench",
	       o.transport == T_SOCKET ? "socket" : "pipe", o.groups, per_group_receivers,
	       o.loops, o.size, npids, ncpu, messages, messages * o.size, t1 - t0);
	fflush(stdout);
	return 0;
}
