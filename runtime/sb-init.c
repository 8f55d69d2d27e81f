/*
 * sb-init: PID 1 of a sandbox forked from the fork template (src/sandbank/sandbox/inside/
 * template.py). The template's child isolates itself in Python, forks the worker, then
 * becomes this program: an init that holds none of the template's ~30 MiB of copied-on-write
 * Python state, only a few pages of its own.
 *
 * It reaps every process reparented to it, and when the worker (argv[1], its pid in the
 * sandbox) ends, writes the worker's exit status (big-endian int32: the exit code, or 128 plus
 * the signal that killed it) on descriptor 4, the server's status pipe, and exits with it.
 * Its PID namespace ends with it, and so does every process left in the sandbox.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define STATUS_FD 4

static void report(int code) {
    unsigned char be[4] = {
        (unsigned char)((uint32_t)code >> 24), (unsigned char)((uint32_t)code >> 16),
        (unsigned char)((uint32_t)code >> 8), (unsigned char)code,
    };
    ssize_t n;
    do {
        n = write(STATUS_FD, be, sizeof be);
    } while (n < 0 && errno == EINTR);
}

int main(int argc, char **argv) {
    char *end = NULL;
    long worker = argc == 2 ? strtol(argv[1], &end, 10) : 0;
    if (worker <= 0 || end == NULL || *end != '\0') {
        return 2;
    }
    for (;;) {
        int status = 0;
        pid_t pid = wait(&status);
        if (pid < 0) {
            if (errno == EINTR) {
                continue;
            }
            report(1); /* ECHILD: the worker is gone without a status */
            _exit(1);
        }
        if (pid == (pid_t)worker) {
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            report(code);
            _exit(code);
        }
    }
}
