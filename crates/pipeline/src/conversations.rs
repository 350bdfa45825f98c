//! Conversation memory: a turn's history read from the store (checked
//! to be the caller's and of the same collection), and each answered turn
//! stored after the answer, the next turn of the conversation waiting for
//! it so it reads the history whole.

use crate::PipelineError;
use crate::service::{Pipeline, TURN_WRITE_TIMEOUT};
use ragtime_core::{Message, Tenant};
use std::sync::{Arc, PoisonError};

impl Pipeline {
    /// Stores a turn of `conversation` (the question and the answer), within
    /// [`TURN_WRITE_TIMEOUT`]; a failure is logged, the answer stands.
    pub(crate) async fn store_turn(
        &self,
        conversation: &str,
        collection: &str,
        query: &str,
        text: &str,
    ) {
        let write = self
            .corpus
            .store
            .append_turn(conversation, collection, query, text);
        match tokio::time::timeout(TURN_WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "could not store the conversation turn"),
            Err(_) => tracing::error!("storing the conversation turn timed out"),
        }
    }

    pub(crate) fn writing_lock(&self, conversation: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        m.entry(conversation.to_owned()).or_default().clone()
    }

    pub(crate) fn done_writing(&self, conversation: &str, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut m = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        // Ours and the map's: nobody else waits on it.
        if Arc::strong_count(&lock) <= 2 {
            m.remove(conversation);
        }
    }

    /// The conversation's id and the turns its prompt gets: the stored ones
    /// for a known conversation, else the client's own earlier messages.
    pub(crate) async fn history(
        &self,
        tenant: &Tenant,
        stored_collection: &str,
        id: Option<String>,
        earlier: Vec<Message>,
    ) -> Result<(String, Vec<Message>), PipelineError> {
        let keep = self.settings.history_messages;
        let tail = |mut v: Vec<Message>| {
            v.drain(..v.len().saturating_sub(keep));
            v
        };
        let Some(id) = id else {
            return Ok((uuid::Uuid::new_v4().to_string(), tail(earlier)));
        };
        let store = &self.corpus.store;
        let conv = tenant.conversation(&id);
        // A turn of this conversation still being stored comes first.
        let pending = self
            .writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&conv)
            .cloned();
        if let Some(lock) = pending {
            let _ = tokio::time::timeout(TURN_WRITE_TIMEOUT, lock.lock()).await;
        }
        let internal = |e: ragtime_store::StoreError| PipelineError::Internal(e.to_string());
        match store
            .conversation_collection(&conv)
            .await
            .map_err(internal)?
        {
            Some(c) if c != stored_collection => Err(PipelineError::invalid(
                "conversation_id",
                "this conversation belongs to another collection",
            )),
            Some(_) => {
                let turns = store.recent_turns(&conv, keep).await.map_err(internal)?;
                let h = turns
                    .into_iter()
                    .map(|t| Message::new(&t.role, t.content))
                    .collect();
                Ok((id, h))
            }
            None => Ok((id, tail(earlier))),
        }
    }
}
