/*
 * pubsubclub_sysv.h - the System V message-queue protocol of a pubsubclub node.
 *
 * The wire of ../../docs/specs/sysv-protocol.pl.md with the values the
 * project chose where the spec leaves them open (docs/sysv.md). The Python
 * side (pubsubclub/frontends/sysv/codec.py, class Signal) uses exactly these
 * numbers; tests/test_sysv_codec.py parses this file and checks that they agree.
 *
 * Every message on the queue is one struct message, sent with
 *     msgsnd(qid, &m, MESSAGE_SIZE, 0)
 * and read with
 *     msgrcv(qid, &m, MESSAGE_SIZE, getpid(), 0)
 * Zero the whole struct before filling it in (memset), so that a 16-character
 * nick or channel, which fills shortText without a terminator, is followed by
 * a NUL in longText.
 */
#ifndef PUBSUBCLUB_SYSV_H
#define PUBSUBCLUB_SYSV_H

/* The spec's queue key; a node serves the key given with --sysv. */
#define PUBSUBCLUB_SYSV_KEY 0x420

/* receiver of every message to the server, and sender of every server message. */
#define SERVER_ID 1

#define SHORT_TEXT_SIZE 16
#define LONG_TEXT_SIZE 256

struct message
{
    long receiver;   /* the System V message type: 1 for the server, a client's PID */
    int sender;      /* 1 for the server, the client's PID */
    int type;        /* a signal code below, or a delivery counter >= MESSAGE_COUNT_BASE */
    char shortText[SHORT_TEXT_SIZE];  /* nick or channel */
    char longText[LONG_TEXT_SIZE];    /* message text, or a subscription's quantity */
};

/* The msgsz of every message: the struct without its leading long. */
#define MESSAGE_SIZE (sizeof(struct message) - sizeof(long))

/* Signals sent by a client (receiver = SERVER_ID). */
#define CONNECTION 1
#define LOGIN 2
#define LOGOUT 3
#define SUBSCRIBE 4
#define UNSUBSCRIBE 5
#define MESSAGE 6
#define MSGREG 7
#define BLOCK 8
#define UNBLOCK 9
#define QUIT 10

/* Signals sent by the server (sender = SERVER_ID). */
#define OPERATION_SUCCESS 20
#define INVALID_USERNAME 21
#define SENDER_NOT_RECOGNIZED 22
#define SERVER_OVERFLOW 23
#define UNAVAILABLE 24
#define NEW_CHANNEL 25
#define NO_CHANNEL 26

/* A delivered message has type = its counter, never below this; every signal code is below it. */
#define MESSAGE_COUNT_BASE 1000

#endif /* PUBSUBCLUB_SYSV_H */
