-- Conversations are kept for chat.retention_days: expired messages are
-- found by their time.
CREATE INDEX messages_by_time ON messages (at_ms);
