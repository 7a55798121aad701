//! Agentry's store: the append-only event log of every session, and the configuration store.
//!
//! One type, [`Store`], over two backends with the same API and the same behaviour: an embedded
//! SQLite file (the default; [`Store::open_home`] opens `agentry.db` in the Agentry home folder)
//! or a PostgreSQL server that several nodes can share ([`Store::connect`] with a
//! `postgres://…` URL).
//!
//! - **Sessions** carry a title, a status the engine sets, read/unread state, an optional expiry
//!   and opaque metadata.
//! - **The event log** is append-only: [`Store::append`] numbers events 1, 2, 3… per session,
//!   atomically and without gaps under concurrent writers, optionally conditional on the last
//!   number the writer saw. Payloads are JSON the store never interprets. Nothing is rewritten,
//!   so storage grows linearly with a session.
//! - **Forks** ([`Store::fork_session`]) reference their parent's history up to the fork point
//!   instead of copying it; [`Store::events`] reads through the chain with continuous numbering.
//!   Deleting a parent copies the referenced part into its forks first, so they keep working.
//! - **Memories** ([`Store::remember`]): facts, preferences and decisions per agent (and user),
//!   de-duplicated and searchable through SQLite FTS5 or PostgreSQL full-text search.
//! - **The run queue** ([`Store::enqueue_run`], [`Store::claim_runs`]): background runs as
//!   durable records that workers claim under leases fenced by an epoch; **schedules**
//!   ([`Store::due_schedules`], [`Store::advance_schedule`]) that submit runs to it; and the
//!   **webhook outbox** ([`Store::enqueue_delivery`], [`Store::claim_deliveries`]).
//! - **The usage ledger** ([`Store::usage_report`], [`Store::spent`]): one row per model call,
//!   written with its event, summed for reports and budgets.
//! - **Workflow step events** ([`Store::append_workflow_events`]): each transition of a
//!   workflow run's steps, numbered per run (a number taken refuses the batch: one driver per
//!   run), read back after the run's snapshot.
//! - **The cluster** ([`Store::join_cluster`], [`Store::heartbeat`]): the nodes sharing the
//!   database, each with a heartbeat that also renews its runs' leases, and the configuration's
//!   generation every node watches to rebuild after a change.
//! - **Configuration** documents by [`ConfigKind`] and name, and **secrets** sealed with
//!   XChaCha20-Poly1305 under a [`SecretKey`] kept outside the database.
//!
//! Schema changes are embedded migrations (one set per dialect), applied at open inside a
//! transaction and recorded in `agentry_migrations`; a database newer than the build is refused.
//!
//! Durability: SQLite runs in WAL mode with `synchronous = NORMAL` by default, so a committed
//! event survives a crash of the process; [`Durability::Full`] makes it survive power loss too,
//! at the cost of an fsync per commit. PostgreSQL follows the server's settings.

mod cluster;
mod config;
mod db;
mod error;
mod group_commit;
mod memory;
mod model;
mod runs;
mod schedules;
mod secret;
mod sqlite_commit;
mod store;
pub mod usage;
mod webhooks;
mod workflow_events;

pub use cluster::{NodeBeat, NodeRecord, RenewedLease, check_node_id};
pub use db::{PING_AFTER_IDLE, SCHEMA_VERSION};
pub use error::StoreError;
pub use group_commit::CommitCounts;
pub use memory::{
    MAX_MEMORY_CHARS, MAX_MEMORY_LIMIT, MemoryKind, MemoryRecord, MemoryScope, NewMemory,
    normalize_memory,
};
pub use model::{
    Backend, ConfigKind, ConfigReplaced, NewEvent, NewSession, SearchHit, SecretInfo, SessionQuery,
    SessionRecord, StoredEvent,
};
pub use runs::{Enqueued, Lease, NewRun, RunMark, RunQuery, RunRecord, RunState};
pub use schedules::{NewSchedule, ScheduleRecord};
pub use secret::{OpenedSecret, SecretKey};
pub use store::{Durability, Store, StoreOptions};
pub use usage::{MAX_USAGE_GROUPS, SpendScope, UsageDimension, UsageEntry, UsageGroup, UsageQuery};
pub use webhooks::{AttemptOutcome, AttemptRecord, DeliveryRecord};

pub use agentry_types::SessionId;
