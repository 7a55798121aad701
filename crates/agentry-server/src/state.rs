//! What every request handler shares: the application, and what only HTTP needs (logins and
//! keys, metrics, the Host/Origin policy).

use std::sync::Arc;

use agentry_app::auth::Authenticator;
use agentry_app::domain::store::Store;
use agentry_app::{App, ToolEnvironment};

use crate::access::AccessPolicy;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// The server's shared state: the [`App`] (`state.app`, named where a handler calls it) and the
/// HTTP layer's own parts, each a field of its own (no `Deref`). Cheap to clone (every request
/// clones it, often more than once): every part is a handle to something shared. Changing a part
/// is for setting up, before the state is shared.
#[derive(Clone)]
pub struct AppState {
    /// The application every handler submits to.
    pub app: App,
    /// API keys and logins.
    pub auth: Authenticator,
    /// Prometheus metrics (also the hub's run observer).
    pub metrics: Arc<Metrics>,
    /// Which `Host` names and browser origins may reach the API (the origins are also the
    /// CORS origins; none: CORS off).
    pub access: Arc<AccessPolicy>,
}

impl AppState {
    /// State over `store`, with the runtime built from its configuration.
    pub async fn new(store: Store) -> Result<Self, ApiError> {
        Box::pin(Self::with_tools(store, ToolEnvironment::default())).await
    }

    /// State over `store` whose runs work in `tools`' workspaces and sandboxes.
    pub async fn with_tools(store: Store, tools: ToolEnvironment) -> Result<Self, ApiError> {
        let metrics = Arc::new(Metrics::default());
        let app = Box::pin(App::observed(store.clone(), tools, metrics.clone())).await?;
        Ok(Self {
            app,
            auth: Authenticator::new(store),
            metrics,
            access: Arc::new(AccessPolicy::default()),
        })
    }
}
