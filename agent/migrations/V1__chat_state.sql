-- The agent's durable state, shared by every agent of a deployment (issue 38).

-- One row per chat: its room (known from its first turn), its highest plausible seq, and how
-- many turns and attachments it has (running totals: a turn's history is read without counting).
CREATE TABLE chats (
    chat_id     text PRIMARY KEY,
    room_id     text,
    thread_root text,
    last_seq    bigint NOT NULL DEFAULT 0,
    turns       bigint NOT NULL DEFAULT 0,
    attachments bigint NOT NULL DEFAULT 0
);

-- Turns in arrival order (n = 1, 2, …), identified by message id. `record` is the turn as
-- admitted (a TurnRecord), `ended` how it ended last (a TurnEnd, NULL while it never ended);
-- `attachments_before` counts the attachments of the turns before it.
CREATE TABLE turns (
    chat_id            text    NOT NULL REFERENCES chats (chat_id),
    n                  bigint  NOT NULL,
    id                 text    NOT NULL,
    seq                bigint  NOT NULL,
    status             text    NOT NULL,
    attachments        integer NOT NULL,
    attachments_before bigint  NOT NULL,
    record      jsonb   NOT NULL,
    ended       jsonb,
    PRIMARY KEY (chat_id, n),
    UNIQUE (chat_id, id)
);
CREATE INDEX turns_pending ON turns (chat_id, n) WHERE status = 'pending';

-- Approvals remembered for good: per user ('' for grants from before they were per user,
-- which count for the whole chat).
CREATE TABLE approvals (
    chat_id  text NOT NULL REFERENCES chats (chat_id),
    user_id  text NOT NULL,
    tool     text NOT NULL,
    resource text NOT NULL,
    PRIMARY KEY (chat_id, user_id, tool, resource)
);

-- The memory tools' facts, per Matrix user and per room (kind 'user' or 'room').
CREATE TABLE memory_scopes (
    kind   text   NOT NULL,
    owner  text   NOT NULL,
    next_n bigint NOT NULL,
    PRIMARY KEY (kind, owner)
);
CREATE TABLE memory_facts (
    kind       text   NOT NULL,
    owner      text   NOT NULL,
    n          bigint NOT NULL,
    text       text   NOT NULL,
    created_ms bigint NOT NULL,
    PRIMARY KEY (kind, owner, n),
    FOREIGN KEY (kind, owner) REFERENCES memory_scopes (kind, owner)
);

-- Who runs a chat's turns now: one agent at a time, cluster-wide, until `expires_at` unless
-- renewed. `token` grows with every new holder (a fencing token).
CREATE TABLE chat_leases (
    chat_id    text        PRIMARY KEY,
    holder     text        NOT NULL,
    token      bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
