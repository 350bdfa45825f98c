-- Chat conversations and their messages (the last turns go into the prompt).
CREATE TABLE conversations (
    id          TEXT   PRIMARY KEY,
    collection  TEXT   NOT NULL,
    created_ms  BIGINT NOT NULL
);

CREATE TABLE messages (
    id              BIGSERIAL PRIMARY KEY,
    conversation_id TEXT   NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role            TEXT   NOT NULL CHECK (role IN ('user', 'assistant')),
    content         TEXT   NOT NULL,
    at_ms           BIGINT NOT NULL
);

CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
