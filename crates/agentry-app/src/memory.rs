//! Long-term memories injected into an agent's system prompt, within a token budget.
//!
//! For a run as a saved agent, the memories that match the new message (full-text search) come
//! first, then the most recently stored ones, the user's (when the request names a user) before
//! the agent's own, each at most once, until the budget is spent. They are appended to the
//! system prompt in a `<memories>` block that tells the model they may be out of date.

use std::collections::HashSet;

use agentry_core::RunRequest;
use agentry_llm::TokenCounter;
use agentry_store::{MemoryKind, MemoryRecord, MemoryScope, NewMemory, Store};

use crate::App;
use crate::error::AppError;

/// The agents' memories as a front-end manages them ([`App::memories`]).
pub struct Memories<'a> {
    store: &'a Store,
}

impl App {
    /// The agents' long-term memories.
    pub fn memories(&self) -> Memories<'_> {
        Memories {
            store: &self.parts.store,
        }
    }
}

impl Memories<'_> {
    /// Whether a saved agent `id` exists (memories belong to one).
    pub async fn agent_exists(&self, id: &str) -> Result<bool, AppError> {
        Ok(self
            .store
            .config(agentry_store::ConfigKind::Agent, id)
            .await?
            .is_some())
    }

    /// The latest `limit` memories of `scope`, or those matching `query` (full-text search).
    pub async fn list(
        &self,
        scope: &MemoryScope,
        query: Option<&str>,
        limit: usize,
    ) -> Result<Vec<MemoryRecord>, AppError> {
        Ok(match query {
            Some(query) => self.store.search_memories(scope, query, limit).await?,
            None => self.store.memories(scope, limit).await?,
        })
    }

    /// Stores a memory, or refreshes the one saying the same; true when it is new.
    pub async fn remember(&self, memory: NewMemory) -> Result<(MemoryRecord, bool), AppError> {
        Ok(self.store.remember(memory).await?)
    }

    /// The memory `id`.
    pub async fn get(&self, id: u64) -> Result<Option<MemoryRecord>, AppError> {
        Ok(self.store.memory(id).await?)
    }

    /// Edits the memory `id`; `None` when there is none.
    pub async fn edit(
        &self,
        id: u64,
        kind: MemoryKind,
        text: &str,
    ) -> Result<Option<MemoryRecord>, AppError> {
        Ok(self.store.update_memory(id, kind, text).await?)
    }

    /// Deletes the memory `id`; false when there is none.
    pub async fn delete(&self, id: u64) -> Result<bool, AppError> {
        Ok(self.store.delete_memory(id).await?)
    }
}

/// Tokens the memories may take in the system prompt by default.
pub const DEFAULT_MEMORY_BUDGET: u64 = 800;

/// Memories read per scope and query before the budget picks among them.
const CANDIDATES: usize = 50;

/// The `<memories>` block for `agent` (and `user`), or `None` when there is nothing to say.
pub async fn memory_block(
    store: &Store,
    agent: &str,
    user: Option<&str>,
    message: &str,
    budget: u64,
) -> Result<Option<String>, AppError> {
    let mut scopes = Vec::with_capacity(2);
    if let Some(user) = user {
        scopes.push(MemoryScope::user(agent, user));
    }
    scopes.push(MemoryScope::agent(agent));
    let mut candidates: Vec<MemoryRecord> = Vec::new();
    let searchable = message.chars().any(char::is_alphanumeric);
    for scope in &scopes {
        if searchable {
            candidates.extend(store.search_memories(scope, message, CANDIDATES).await?);
        }
    }
    for scope in &scopes {
        candidates.extend(store.memories(scope, CANDIDATES).await?);
    }
    Ok(render(&candidates, budget))
}

/// Adds the memories of the agent `request` runs as (and of its user) to `request`, chosen for
/// its input's opening words; a request that runs as no agent is left as it is.
pub async fn remember(store: &Store, request: &mut RunRequest) -> Result<(), AppError> {
    let Some(agent) = request.agent_id.as_deref() else {
        return Ok(());
    };
    let message = crate::titles::first_line(request).unwrap_or_default();
    request.memory = memory_block(
        store,
        agent,
        request.user.as_deref(),
        &message,
        DEFAULT_MEMORY_BUDGET,
    )
    .await?;
    Ok(())
}

/// The block for `candidates` in order, each once, within `budget` tokens.
pub fn render(candidates: &[MemoryRecord], budget: u64) -> Option<String> {
    const HEADER: &str = "<memories>\nWhat you remember from earlier conversations (it may be out \
                          of date; the user's words win):\n";
    const FOOTER: &str = "</memories>";
    let counter = TokenCounter::estimate();
    let mut used = counter.count_text(HEADER) + counter.count_text(FOOTER);
    let mut seen = HashSet::new();
    let mut lines = String::new();
    for memory in candidates {
        if !seen.insert(memory.id) {
            continue;
        }
        let about = match &memory.scope.user {
            Some(user) => format!(" (about {user})"),
            None => String::new(),
        };
        let line = format!("- [{}]{about} {}\n", memory.kind.as_str(), memory.text);
        let tokens = counter.count_text(&line);
        if used + tokens > budget {
            break;
        }
        used += tokens;
        lines.push_str(&line);
    }
    if lines.is_empty() {
        return None;
    }
    Some(format!("{HEADER}{lines}{FOOTER}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_store::MemoryKind;

    fn memory(id: u64, text: &str, user: Option<&str>) -> MemoryRecord {
        MemoryRecord {
            id,
            scope: MemoryScope {
                agent: "a".into(),
                user: user.map(str::to_owned),
            },
            kind: MemoryKind::Fact,
            text: text.into(),
            source_session: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn memories_are_listed_once_in_order_within_the_budget() {
        let candidates = vec![
            memory(1, "Alice likes tea", Some("alice")),
            memory(2, "The build uses cargo", None),
            memory(1, "Alice likes tea", Some("alice")),
            memory(3, &"long ".repeat(400), None),
            memory(4, "Deploys happen on Tuesdays", None),
        ];
        let block = render(&candidates, 120).unwrap();
        assert!(block.starts_with("<memories>\n"));
        assert!(block.contains("- [fact] (about alice) Alice likes tea\n"));
        assert_eq!(block.matches("Alice likes tea").count(), 1);
        assert!(block.contains("The build uses cargo"));
        // The long one does not fit, and stops the list there.
        assert!(!block.contains("long long"));
        assert!(!block.contains("Tuesdays"));
        assert!(render(&[], 800).is_none());
        assert!(render(&candidates, 5).is_none());
    }
}
