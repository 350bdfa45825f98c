//! Conversations: each chat turn (the user's question and the answer given)
//! is stored, so a later request with the same `conversation_id` gets the
//! last turns in its prompt.

use crate::BeginWrite;
use crate::{Pool, Store, StoreError, now_ms};

/// One stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl Store {
    /// Appends a question and its answer to a conversation (created if
    /// new), in one transaction. `collection` is recorded on creation; a
    /// conversation always stays in the collection it started in.
    pub async fn append_turn(
        &self,
        conversation_id: &str,
        collection: &str,
        question: &str,
        answer: &str,
    ) -> Result<(), StoreError> {
        let at = now_ms();
        on_pool!(self, p => {
            let mut tx = p.begin_write().await?;
            sqlx::query("INSERT INTO conversations (id, collection, created_ms) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING")
                .bind(conversation_id)
                .bind(collection)
                .bind(at)
                .execute(&mut *tx)
                .await?;
            for (role, content) in [("user", question), ("assistant", answer)] {
                sqlx::query("INSERT INTO messages (conversation_id, role, content, at_ms) VALUES ($1, $2, $3, $4)")
                    .bind(conversation_id)
                    .bind(role)
                    .bind(content)
                    .bind(at)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// Removes messages written before `before_ms` and the conversations
    /// they leave empty, in one transaction; returns how many of each.
    pub async fn expire_conversations(&self, before_ms: i64) -> Result<(u64, u64), StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin_write().await?;
            let messages = sqlx::query("DELETE FROM messages WHERE at_ms < $1")
                .bind(before_ms)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            let conversations = sqlx::query(
                "DELETE FROM conversations WHERE created_ms < $1 \
                 AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = conversations.id)",
            )
            .bind(before_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            tx.commit().await?;
            Ok((messages, conversations))
        })
    }

    /// The collection a conversation belongs to, if it exists.
    pub async fn conversation_collection(&self, id: &str) -> Result<Option<String>, StoreError> {
        let q = "SELECT collection FROM conversations WHERE id = $1";
        Ok(on_pool!(self, p => sqlx::query_scalar(q).bind(id).fetch_optional(p).await?))
    }

    /// The last `limit` messages of a conversation, oldest first.
    pub async fn recent_turns(&self, id: &str, limit: usize) -> Result<Vec<Turn>, StoreError> {
        let q = "SELECT role, content FROM (SELECT id, role, content FROM messages WHERE conversation_id = $1 ORDER BY id DESC LIMIT $2) AS t ORDER BY id";
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(String, String)> =
            on_pool!(self, p => sqlx::query_as(q).bind(id).bind(limit).fetch_all(p).await?);
        Ok(rows
            .into_iter()
            .map(|(role, content)| Turn { role, content })
            .collect())
    }
}
