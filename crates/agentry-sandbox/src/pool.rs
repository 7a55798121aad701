//! One long-lived sandbox per workspace, made on first use and made again after it closed (idle
//! timeout, wall time, a crash inside): what the built-in tools of a session share.
//!
//! A pool holds at most [`SandboxPool::max_sandboxes`] open sandboxes ([`DEFAULT_MAX_SANDBOXES`]
//! unless set): asking for one more workspace's sandbox is [`SandboxError::PoolFull`] until one
//! closes (idle ones close after their idle timeout).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::backend::Backend;
use crate::error::{Result, SandboxError};
use crate::policy::SandboxSpec;
use crate::sandbox::Sandbox;

/// How long a session's sandbox may sit idle before it is closed (it is made again on the next
/// use; the workspace stays).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How many sandboxes a pool keeps open at once by default.
pub const DEFAULT_MAX_SANDBOXES: usize = 64;

type Cell = Arc<OnceCell<Sandbox>>;

/// Sandboxes by workspace folder, over one backend. Cheap to clone.
#[derive(Clone)]
pub struct SandboxPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    backend: Arc<dyn Backend>,
    template: SandboxSpec,
    sandboxes: Mutex<HashMap<PathBuf, Cell>>,
    max_sandboxes: usize,
}

impl std::fmt::Debug for SandboxPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxPool")
            .field("backend", &self.inner.backend.kind())
            .field("sandboxes", &self.len())
            .finish_non_exhaustive()
    }
}

impl SandboxPool {
    /// A pool over `backend`. Every sandbox is made from `template` with its own workspace; a
    /// template without an idle timeout gets [`DEFAULT_IDLE_TIMEOUT`], so idle sandboxes are
    /// reaped. It holds at most [`DEFAULT_MAX_SANDBOXES`] open sandboxes.
    pub fn new(backend: Arc<dyn Backend>, template: SandboxSpec) -> Self {
        Self::with_max_sandboxes(backend, template, DEFAULT_MAX_SANDBOXES)
    }

    /// [`SandboxPool::new`] holding at most `max_sandboxes` open sandboxes.
    pub fn with_max_sandboxes(
        backend: Arc<dyn Backend>,
        mut template: SandboxSpec,
        max_sandboxes: usize,
    ) -> Self {
        if template.idle_timeout.is_none() {
            template.idle_timeout = Some(DEFAULT_IDLE_TIMEOUT);
        }
        Self {
            inner: Arc::new(PoolInner {
                backend,
                template,
                sandboxes: Mutex::new(HashMap::new()),
                max_sandboxes,
            }),
        }
    }

    /// The most sandboxes the pool keeps open at once.
    pub fn max_sandboxes(&self) -> usize {
        self.inner.max_sandboxes
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The specification sandboxes are made from (its workspace is replaced per sandbox).
    pub fn template(&self) -> &SandboxSpec {
        &self.inner.template
    }

    fn cells(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Cell>> {
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The cell of `workspace`: its own, or a new one if the pool has room (sandboxes that
    /// closed are forgotten first, and one still being made counts).
    fn cell(&self, workspace: &Path) -> Result<Cell> {
        let mut cells = self.cells();
        if let Some(cell) = cells.get(workspace) {
            return Ok(Arc::clone(cell));
        }
        cells.retain(|_, cell| {
            cell.get()
                .is_none_or(|sandbox| sandbox.closed_reason().is_none())
        });
        let max = self.inner.max_sandboxes;
        if cells.len() >= max {
            return Err(SandboxError::PoolFull { max });
        }
        Ok(Arc::clone(
            cells.entry(workspace.to_path_buf()).or_default(),
        ))
    }

    /// The sandbox of `workspace`, made if there is none or the last one closed. Concurrent
    /// callers for one workspace share one creation. [`SandboxError::PoolFull`] when the pool
    /// already holds its maximum of open sandboxes for other workspaces.
    pub async fn get(&self, workspace: &Path) -> Result<Sandbox> {
        loop {
            let cell = self.cell(workspace)?;
            let made = cell
                .get_or_try_init(|| {
                    let mut spec = self.inner.template.clone();
                    spec.workspace = workspace.to_path_buf();
                    self.inner.backend.create(spec)
                })
                .await;
            match made {
                Ok(sandbox) if sandbox.closed_reason().is_none() => return Ok(sandbox.clone()),
                Ok(_) => {
                    // Closed since (idle, wall time, killed): forget it and make another.
                    let mut cells = self.cells();
                    if cells.get(workspace).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                        cells.remove(workspace);
                    }
                }
                Err(error) => {
                    let mut cells = self.cells();
                    if cells.get(workspace).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                        cells.remove(workspace);
                    }
                    return Err(error);
                }
            }
        }
    }

    /// The open sandbox of `workspace`, if there is one (nothing is made).
    pub fn existing(&self, workspace: &Path) -> Option<Sandbox> {
        self.cells()
            .get(workspace)
            .and_then(|cell| cell.get().cloned())
            .filter(|sandbox| sandbox.closed_reason().is_none())
    }

    /// Closes the sandbox of `workspace`, if there is one.
    pub async fn close(&self, workspace: &Path) {
        let cell = self.cells().remove(workspace);
        if let Some(sandbox) = cell.and_then(|cell| cell.get().cloned()) {
            sandbox.close().await;
        }
    }

    /// Closes every sandbox (at shutdown).
    pub async fn close_all(&self) {
        let cells: Vec<Cell> = self.cells().drain().map(|(_, cell)| cell).collect();
        for sandbox in cells.iter().filter_map(|cell| cell.get()) {
            sandbox.close().await;
        }
    }

    /// How many sandboxes the pool holds (some may have closed since).
    pub fn len(&self) -> usize {
        self.cells().len()
    }

    /// Whether the pool holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
