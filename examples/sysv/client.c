/*
 * client.c - a small interactive client of a pubsubclub node's System V queue.
 *
 * Build:  gcc -std=c11 -Wall -Wextra -O2 -o examples/sysv/client examples/sysv/client.c
 *         (or: make examples/sysv/client)
 * Run:    examples/sysv/client [KEY]        KEY defaults to 0x420, as in `pubsubclub node --sysv 0x420`
 *         (decimal, 0x hex or 0 octal; not 0, which is IPC_PRIVATE). --help prints the usage and
 *         exits 0; a bad KEY or extra arguments print it on stderr and exit 2.
 *
 * One command per line on stdin:
 *   connect                     CONNECTION
 *   login NICK                  LOGIN (the nick is laid out as strcpy would: 17+ characters spill into longText)
 *   logout                      LOGOUT
 *   register CHANNEL            MSGREG
 *   subscribe CHANNEL [K]       SUBSCRIBE; K > 0: K messages, else (or none) durable
 *   unsubscribe CHANNEL         UNSUBSCRIBE
 *   send CHANNEL TEXT...        MESSAGE with longText "[CHANNEL] [NICK]: TEXT"
 *   block NICK / unblock NICK   BLOCK / UNBLOCK
 *   poll                        print what is waiting now
 *   quit                        QUIT, then exit (end of input does the same)
 *
 * One line on stdout per event, so scripts and tests can read them:
 *   ready PID                   started; the queue is there
 *   reply SIGNAL                the server's answer to the last command (e.g. reply OPERATION_SUCCESS)
 *   timeout                     no answer within 5 s
 *   new_channel NAME            NEW_CHANNEL
 *   message COUNT CHANNEL TEXT  a delivery (newlines and backslashes in TEXT escaped as \n and \\)
 *   error TEXT                  a bad command or a failed system call
 * While idle it polls the queue every 20 ms and prints what arrives.
 */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <time.h>
#include <unistd.h>

#include "pubsubclub_sysv.h"

#define REPLY_TIMEOUT_MS 5000
#define IDLE_POLL_MS 20
/* The longest command line, and so the longest text a send command can give. */
#define LINE_BYTES 4096

static int qid = -1;
static long me;
static char nick[SHORT_TEXT_SIZE + LONG_TEXT_SIZE] = "";
static volatile sig_atomic_t stop_requested = 0;

static const char *signal_name(int type)
{
    switch (type) {
    case OPERATION_SUCCESS: return "OPERATION_SUCCESS";
    case INVALID_USERNAME: return "INVALID_USERNAME";
    case SENDER_NOT_RECOGNIZED: return "SENDER_NOT_RECOGNIZED";
    case SERVER_OVERFLOW: return "SERVER_OVERFLOW";
    case UNAVAILABLE: return "UNAVAILABLE";
    case NEW_CHANNEL: return "NEW_CHANNEL";
    case NO_CHANNEL: return "NO_CHANNEL";
    default: return NULL;
    }
}

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR && !stop_requested) {
    }
}

/* A C string from a char array that may lack its terminator. */
static void copy_text(char *out, const char *in, size_t size)
{
    size_t n = strnlen(in, size);
    memcpy(out, in, n);
    out[n] = '\0';
}

static void print_escaped(const char *text)
{
    for (; *text; text++) {
        if (*text == '\n')
            fputs("\\n", stdout);
        else if (*text == '\\')
            fputs("\\\\", stdout);
        else if (*text == '\r')
            fputs("\\r", stdout);
        else
            putchar(*text);
    }
}

/* Print one server message; return 1 if it is the reply to a request. */
static int show(const struct message *m)
{
    char short_text[SHORT_TEXT_SIZE + 1], long_text[LONG_TEXT_SIZE + 1];
    copy_text(short_text, m->shortText, SHORT_TEXT_SIZE);
    copy_text(long_text, m->longText, LONG_TEXT_SIZE);
    int is_reply = 0;
    if (m->type >= MESSAGE_COUNT_BASE) {
        printf("message %d %s ", m->type, short_text[0] ? short_text : "-");
        print_escaped(long_text);
        putchar('\n');
    } else if (m->type == NEW_CHANNEL) {
        printf("new_channel %s\n", short_text);
    } else if (signal_name(m->type) != NULL) {
        printf("reply %s\n", signal_name(m->type));
        is_reply = 1;
    } else {
        printf("error unknown message type %d\n", m->type);
    }
    fflush(stdout);
    return is_reply;
}

/* Print everything waiting for us; return 1 if a reply was among it. */
static int drain(void)
{
    struct message m;
    int replied = 0;
    for (;;) {
        ssize_t n = msgrcv(qid, &m, MESSAGE_SIZE, me, IPC_NOWAIT | MSG_NOERROR);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != ENOMSG) {
                printf("error msgrcv: %s\n", strerror(errno));
                fflush(stdout);
                exit(1);
            }
            return replied;
        }
        replied |= show(&m);
    }
}

static void send_message(struct message *m)
{
    m->receiver = SERVER_ID;
    m->sender = (int)me;
    while (msgsnd(qid, m, MESSAGE_SIZE, 0) == -1) {
        if (errno == EINTR && !stop_requested)
            continue;
        printf("error msgsnd: %s\n", strerror(errno));
        fflush(stdout);
        exit(1);
    }
}

/* Send a request and print messages until its reply arrives (or 5 s pass). */
static void request(struct message *m)
{
    send_message(m);
    for (int waited = 0; waited < REPLY_TIMEOUT_MS; waited++) {
        if (drain())
            return;
        sleep_ms(1);
    }
    printf("timeout\n");
    fflush(stdout);
}

/* strcpy's layout: the name from shortText on, a long one running on into longText. */
static void put_name(struct message *m, const char *name)
{
    size_t room = sizeof(struct message) - offsetof(struct message, shortText);
    size_t n = strlen(name) + 1;
    if (n > room) {
        n = room;
    }
    memcpy((char *)m + offsetof(struct message, shortText), name, n);
}

static void put_channel(struct message *m, const char *channel)
{
    /* 16 characters fill shortText without a terminator, as the spec allows; more are cut. */
    memcpy(m->shortText, channel, strnlen(channel, SHORT_TEXT_SIZE));
}

static void quit_and_exit(void)
{
    struct message m;
    memset(&m, 0, sizeof m);
    m.type = QUIT;
    send_message(&m);
    exit(0);
}

static void command(char *line)
{
    struct message m;
    memset(&m, 0, sizeof m);
    char *verb = strtok(line, " \t");
    if (verb == NULL)
        return;
    char *arg = strtok(NULL, " \t");
    char *rest = strtok(NULL, "");
    if (strcmp(verb, "connect") == 0) {
        m.type = CONNECTION;
    } else if (strcmp(verb, "login") == 0 && arg) {
        m.type = LOGIN;
        put_name(&m, arg);
        snprintf(nick, sizeof nick, "%s", arg);
    } else if (strcmp(verb, "logout") == 0) {
        m.type = LOGOUT;
    } else if (strcmp(verb, "register") == 0 && arg) {
        m.type = MSGREG;
        put_name(&m, arg);
    } else if (strcmp(verb, "subscribe") == 0 && arg) {
        m.type = SUBSCRIBE;
        put_channel(&m, arg);
        snprintf(m.longText, LONG_TEXT_SIZE, "%d", rest ? atoi(rest) : 0);
    } else if (strcmp(verb, "unsubscribe") == 0 && arg) {
        m.type = UNSUBSCRIBE;
        put_name(&m, arg);
    } else if (strcmp(verb, "send") == 0 && arg) {
        m.type = MESSAGE;
        put_channel(&m, arg);
        char channel[SHORT_TEXT_SIZE + 1];
        copy_text(channel, m.shortText, SHORT_TEXT_SIZE);
        char text[LONG_TEXT_SIZE + sizeof nick + LINE_BYTES];
        snprintf(text, sizeof text, "[%s] [%s]: %s", channel, nick, rest ? rest : "");
        memcpy(m.longText, text, strnlen(text, LONG_TEXT_SIZE - 1)); /* cut to fit, keeping a terminator */
    } else if (strcmp(verb, "block") == 0 && arg) {
        m.type = BLOCK;
        put_name(&m, arg);
    } else if (strcmp(verb, "unblock") == 0 && arg) {
        m.type = UNBLOCK;
        put_name(&m, arg);
    } else if (strcmp(verb, "poll") == 0) {
        drain();
        return;
    } else if (strcmp(verb, "quit") == 0) {
        quit_and_exit();
    } else {
        printf("error unknown command or missing argument: %s\n", verb);
        fflush(stdout);
        return;
    }
    request(&m);
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: client [KEY]\n"
            "  KEY  the node's queue key, as given to `pubsubclub node --sysv KEY` (default %#x);\n"
            "       decimal, 0x hex or 0 octal, not 0 (IPC_PRIVATE)\n"
            "Commands on stdin, one per line: connect, login NICK, logout, register CHANNEL,\n"
            "subscribe CHANNEL [K], unsubscribe CHANNEL, send CHANNEL TEXT, block NICK,\n"
            "unblock NICK, poll, quit. See docs/sysv.md.\n",
            PUBSUBCLUB_SYSV_KEY);
}

/* The queue key from the command line; exits 2 (with the usage) when it is not one. */
static long parse_key(int argc, char **argv)
{
    if (argc < 2)
        return PUBSUBCLUB_SYSV_KEY;
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        exit(0);
    }
    char *end = NULL;
    errno = 0;
    long key = strtol(argv[1], &end, 0);
    /* 0 is IPC_PRIVATE: msgget would make a new private queue instead of finding the node's. */
    if (argc > 2 || argv[1][0] == '\0' || *end != '\0' || errno != 0 || key <= 0 || key > 0x7fffffffL) {
        if (argc > 2)
            fprintf(stderr, "client: one argument expected, got %d\n", argc - 1);
        else
            fprintf(stderr, "client: bad queue key '%s'\n", argv[1]);
        usage(stderr);
        exit(2);
    }
    return key;
}

int main(int argc, char **argv)
{
    long key = parse_key(argc, argv);
    qid = msgget((key_t)key, 0);
    if (qid == -1) {
        printf("error no queue with key %#lx (is the node running with --sysv?): %s\n", key, strerror(errno));
        return 1;
    }
    me = (long)getpid();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("ready %ld\n", me);
    fflush(stdout);

    char buffer[LINE_BYTES];
    size_t held = 0;
    for (;;) {
        if (stop_requested)
            quit_and_exit();
        struct pollfd in = {STDIN_FILENO, POLLIN, 0};
        int ready = poll(&in, 1, IDLE_POLL_MS);
        if (ready <= 0) {
            drain();
            continue;
        }
        ssize_t n = read(STDIN_FILENO, buffer + held, sizeof buffer - 1 - held);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            quit_and_exit();
        held += (size_t)n;
        char *start = buffer;
        char *newline;
        while ((newline = memchr(start, '\n', held - (size_t)(start - buffer))) != NULL) {
            *newline = '\0';
            if (newline > start && newline[-1] == '\r')
                newline[-1] = '\0';
            command(start);
            start = newline + 1;
        }
        held -= (size_t)(start - buffer);
        memmove(buffer, start, held);
        if (held == sizeof buffer - 1) {
            printf("error line too long\n");
            fflush(stdout);
            held = 0;
        }
    }
}
